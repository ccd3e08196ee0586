"""sample.py — text from a trained language model: a run folder's best.pt, a prompt, a number of tokens.

    python sample.py --run runs/shakespeare_cpu --prompt "ROMEO:" --tokens 500 --temperature 0.8 --top-k 50
    python sample.py --run runs/shakespeare_cpu --temperature 0          # greedy: the most likely token each time
    python sample.py --run runs/shakespeare_cpu --no-cache               # recompute every position (slower, same text)
    python sample.py --run runs/my_tokens_run --data-root DIR           # decode with DIR's meta file instead

The weights load with weights_only=True (no code runs from the file), from any strategy's checkpoint (DDP, FSDP:
plain state dicts). Any registered language model samples: one with a `generate_stream` generates through it (the
GPT's keeps a KV cache: each new token costs one position's work instead of the whole context's; gpt.py has its
window rule past the model's block size); any other runs on the whole context for every new token (`plain_stream`).
The text is printed as it is made; Ctrl-C stops it and keeps what was printed.
Vocabularies it decodes, as the run's data describes them: bytes (the shakespeare dataset), or a tokens folder's
meta.json/meta.pkl itos (or stoi) of single characters or longer token strings (subwords: the prompt is split by
greedy longest match, not necessarily the tokenizer's own split), or the BPE of prepare.py --tokens bpe (tokenizer.json:
the prompt is split by the BPE itself). A tokens run keeps its vocabulary in its run folder (meta.json, and
tokenizer.json), so the folder alone samples on any machine; older runs read the data.root their checkpoint recorded. A
meta file without strings (GPT-2's ids from tiktoken) is refused in one line saying what to write into it, and one
whose vocabulary is not the checkpoint's (its fingerprint differs: other strings, even of the same size) in one line.
Exit codes: 0 done; 1 the checkpoint or the data's vocabulary cannot be read; 2 bad flags, or a vocabulary that is not
the model's; 130 stopped by Ctrl-C.
"""
import argparse
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from . import checkpoint, config, data, gpt, models, text, train


class OtherVocabulary(Exception):
    """The vocabulary found is not the one the model was trained on (exit 2)."""


def load_model(path: Path) -> tuple[torch.nn.Module, config.Config, data.TextInfo]:
    """The model of a language-model checkpoint, in eval mode, the run's config and its data's description."""
    ckpt = checkpoint.load(path)
    cfg = config.from_dict(ckpt["config"])
    if ckpt["info"]["task"] != "lm":
        raise checkpoint.CheckpointError(f"{path} holds a {ckpt['info']['task']!r} model, not a language model")
    info = data.info_from(ckpt["info"])
    model = models.build(cfg.model, info)
    checkpoint.load_weights(model, path)
    return model.eval(), cfg, info


def vocabulary_folder(cfg: config.Config, data_root: Path | None, path: Path) -> str:
    """Where a tokens run's meta file is read: --data-root if given, else the run folder's own copy (beside the
    checkpoint at `path`), else the data.root the checkpoint recorded, which need not exist here (another machine, or
    relative to another directory)."""
    if data_root is not None:
        return str(data_root)
    if (path.parent / "meta.json").is_file():
        return str(path.parent)
    if not Path(cfg.data.root).is_dir():
        raise text.TextDataError(f"data.root {cfg.data.root!r}, recorded in {path}, is not a folder here and the run "
                                 f"folder keeps no meta.json (a run of an older template): pass --data-root DIR, the "
                                 f"folder holding the run's meta.json or meta.pkl")
    return cfg.data.root


def load_tokenizer(cfg: config.Config, data_root: Path | None, path: Path, info: data.TextInfo) -> text.Tokenizer:
    """The run's tokenizer: bytes, or a tokens run's vocabulary (vocabulary_folder), which must be the one the
    checkpoint recorded the fingerprint of (a checkpoint of an older template records none: then its vocabulary
    must at least fit the one the model was trained on)."""
    root = vocabulary_folder(cfg, data_root, path) if cfg.data.dataset == "tokens" else cfg.data.root
    tokenizer = text.tokenizer(cfg.data.dataset, root)
    if info.vocab is not None and tokenizer.fingerprint != info.vocab:
        raise OtherVocabulary(f"the vocabulary in {root} (fingerprint {tokenizer.fingerprint}, {tokenizer.vocab_size} "
                              f"tokens) is not the one {path} was trained on (fingerprint {info.vocab}): give "
                              f"--data-root the folder of the run's own data")
    if tokenizer.vocab_size > info.vocab_size:
        raise text.TextDataError(f"the meta file in {root} has vocab_size {tokenizer.vocab_size}, more token ids than "
                                 f"the {info.vocab_size} the model was trained on: --data-root must be the folder of "
                                 f"the run's own data")
    return tokenizer


@torch.no_grad()
def plain_stream(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float,
                 top_k: int | None, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Each new token (B, 1) of a model without `generate_stream`: its logits on the whole context (the last
    `block_size` tokens if the model has a `block_size`), the last position's drawn as the GPT draws them. The model
    runs in eval mode until the stream ends or is closed."""
    was_training = model.training
    model.eval()
    window = getattr(model, "block_size", None)
    try:
        for _ in range(max_new_tokens):
            context = idx if window is None else idx[:, -window:]
            next_token = gpt.draw(model(context)[:, -1], temperature, top_k, generator)
            idx = torch.cat([idx, next_token], dim=1)
            yield next_token
    finally:
        model.train(was_training)


def new_tokens(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
               use_cache: bool, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """The model's own generate_stream if it has one (use_cache: its KV cache, if it keeps one), else plain_stream."""
    if hasattr(model, "generate_stream"):
        return model.generate_stream(idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache,
                                     generator=generator)
    return plain_stream(model, idx, max_new_tokens, temperature, top_k, generator)


def stream(model, tokenizer: text.Tokenizer, prompt: str, tokens: int, temperature: float, top_k: int | None,
           seed: int, use_cache: bool = True) -> Iterator[str]:
    """The prompt's text, then the text each new token completes as soon as the model makes it ("" while a
    character's bytes are incomplete), then what the last bytes leave: piece n is the n-th token's, and the pieces
    joined are the decoded whole."""
    ids = tokenizer.encode(prompt)
    decode = tokenizer.decoder()
    generator = torch.Generator().manual_seed(seed)
    yield decode(ids)
    for token in new_tokens(model, torch.tensor([ids], dtype=torch.long), tokens, temperature, top_k, use_cache,
                            generator):
        yield decode(token[0].tolist())
    yield decode([], final=True)


def generate(model, tokenizer: text.Tokenizer, prompt: str, tokens: int, temperature: float, top_k: int | None,
             seed: int, use_cache: bool = True) -> tuple[str, float]:
    """(the prompt and its continuation, seconds the generation took)."""
    t0 = time.perf_counter()
    written = "".join(stream(model, tokenizer, prompt, tokens, temperature, top_k, seed, use_cache))
    return written, time.perf_counter() - t0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help with each flag's default, except None ("default: None" explains nothing), and the docstring's examples
    as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                     formatter_class=HelpFormatter)
    parser.add_argument("--run", type=Path, help="a run folder (its best.pt is used)")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint file instead of --run's best.pt")
    parser.add_argument("--prompt", default="\n", help="the text to continue (default: %(default)r, a new line)")
    parser.add_argument("--tokens", type=int, default=500, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="< 1 sharper, > 1 more random; 0 = greedy")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens; 0 = all")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed: the same seed gives the same text")
    parser.add_argument("--data-root", type=Path,
                        help="the folder holding a tokens run's meta.json or meta.pkl, instead of the run folder's "
                             "own copy (or, for a run that keeps none, the data.root its checkpoint recorded); "
                             "byte-level runs read no data")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole context for every token")
    args = parser.parse_args(argv)
    if (args.run is None) == (args.checkpoint is None):
        parser.error("give one of --run or --checkpoint")
    if args.tokens < 1 or args.temperature < 0 or args.top_k < 0 or args.seed < 0:
        parser.error("--tokens must be >= 1 and --temperature, --top-k, --seed >= 0")
    if not math.isfinite(args.temperature):
        parser.error(f"--temperature must be a finite number, got {args.temperature}")
    if not args.prompt:
        parser.error("--prompt must hold at least one character: the model continues a context")
    if args.data_root is not None and not args.data_root.is_dir():
        parser.error(f"--data-root {args.data_root} is not a folder: give the one holding the run's meta.json or "
                     f"meta.pkl")
    path = args.checkpoint or args.run / "best.pt"
    made = 0  # tokens printed: piece n of the stream is the n-th token's text
    try:
        model, cfg, info = load_model(path)
        tokenizer = load_tokenizer(cfg, args.data_root, path, info)
        t0 = time.perf_counter()
        for made, piece in enumerate(stream(model, tokenizer, args.prompt, args.tokens, args.temperature,
                                            args.top_k or None, args.seed, use_cache=not args.no_cache)):
            print(piece, end="", flush=True)
        seconds = time.perf_counter() - t0
    except (checkpoint.CheckpointError, config.ConfigError, text.TextDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OtherVocabulary as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the text printed so far stays, without a traceback under it
        print(flush=True)
        print(f"[stopped after {made} tokens]", file=sys.stderr)
        return 130
    print()
    print(f"\n[{args.tokens} tokens in {seconds:.2f} s: {args.tokens / seconds:,.0f} tokens/s, "
          f"{'no cache' if args.no_cache else 'KV cache'}; {path}]", file=sys.stderr)
    return 0


def cli() -> None:
    """`python sample.py` at the template's root, and the `template-sample` command of `pip install -e .`."""
    train.exit_with(main)
