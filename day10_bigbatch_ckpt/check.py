"""Day 10 gates: activations grow linearly with the batch; checkpointing and bf16 shrink them; the memory
calculator reproduces the curriculum's figures and predicts what we measure.

Run:  python day10_bigbatch_ckpt/check.py   (or `pytest day10_bigbatch_ckpt`)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day10_bigbatch_ckpt import main as day
from day10_bigbatch_ckpt import memcalc
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
BATCHES = (4, 8, 16)  # b, 2b, 4b


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return day.TinyGPT(day.GPTConfig())


@pytest.fixture(scope="module")
def saved(model):
    """Bytes saved for backward, per mode and batch: one forward pass each."""
    return {mode: [day.saved_bytes(model, b, mode) for b in BATCHES] for mode in day.MODES}


def worst_doubling_error(values) -> float:
    return max(abs(bigger / smaller - 2.0) for smaller, bigger in zip(values, values[1:]))


def test_doubling_the_batch_doubles_activation_memory(saved):
    gates.check("worst |saved(2b)/saved(b) - 2|, b=4,8,16", worst_doubling_error(saved["fp32"]), "<=", 0.1)


def test_checkpointing_cuts_activation_memory_by_half(saved):
    cut = 1 - saved["fp32 + checkpoint"][-1] / saved["fp32"][-1]
    gates.check("checkpointing: activation cut at b=16", cut, ">=", 0.5)


def test_checkpointed_gradients_match_plain_ones(model):
    ratio = day.allclose_ratio(day.gradients(model, 8, "fp32 + checkpoint"), day.gradients(model, 8, "fp32"))
    gates.check("checkpointed grads: allclose ratio (<=1)", ratio, "<=", 1.0)


def test_bf16_autocast_saves_fewer_bytes_than_fp32(saved):
    gates.check("bf16/fp32 saved bytes at b=16", saved["bf16 autocast"][-1] / saved["fp32"][-1], "<", 1.0)


def test_checkpointing_fits_a_larger_batch_in_the_same_budget(model):
    budget = 8 * day.MiB
    plain, ckpt = (day.largest_batch(lambda b, m=mode: day.saved_bytes(model, b, m), budget) for mode in day.MODES[:2])
    assert day.saved_bytes(model, plain, "fp32") <= budget < day.saved_bytes(model, plain + 1, "fp32")
    gates.check("largest batch in 8 MiB: checkpoint - plain", ckpt - plain, ">", 0)


@pytest.fixture(scope="module")
def megatron():
    return day.megatron_check(day.GPTConfig(), batches=(4, 8))


@pytest.mark.parametrize("i", [0, 1], ids=["b=4", "b=8"])
def test_megatron_formula_predicts_measured_block_activations(megatron, i):
    # +-25%: the formula is an estimate; here it is 11% low because CPU dropout masks take 2 bytes, not 1.
    row = megatron[i]
    gates.check(f"Megatron measured/predicted, b={row['batch']}: |ratio-1|", abs(row["ratio"] - 1), "<=", 0.25)


@pytest.mark.parametrize("i", [0, 1], ids=["b=4", "b=8"])
def test_every_saved_byte_is_accounted_for(megatron, i):
    # With the two known differences added (mask width, LayerNorm statistics) nothing is left unexplained.
    row = megatron[i]
    gates.check(f"Megatron + known extras, b={row['batch']}: |ratio-1|", abs(row["explained_ratio"] - 1), "<=",
                0.01)


def test_main_writes_plot_and_tables(tmp_path):
    day.main(["--batches", "2", "4", "--budget-mib", "1", "--time-batch", "2", "--time-s", "0.05", "--layers", "2",
              "--out", str(tmp_path)])
    for name in ("memory_vs_batch.png", "memory_vs_batch.md", "memory_table_12gb.md", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0, name


# --- the memory calculator against the figures the curriculum prints --------------------------------------
def printed_tolerance(printed: str, from_rounded: bool) -> float:
    """Half a unit in the printed last digit. Where the curriculum combined intermediates it had already
    rounded to three significant figures (1.51B, 2.79 GB, 2.72 GB), add the 0.5% that rounding can move a
    result by (e.g. 0.12B at b=16: exact 10.86 GB, printed 10.8 = 0.8 + 1.97 + 7.25 + 0.82)."""
    decimals = len(printed.partition(".")[2])
    return 0.5 * 10**-decimals + (0.005 * abs(float(printed)) if from_rounded else 0.0)


E = memcalc
ROUNDED = {  # figures the curriculum computed from intermediates it had already rounded
    "params h2048 L24 V150k (B)": "exact 1.5152B, printed 1.51",
    "0.12B b16 activations x1.3 (GB)": "2.79 GB x 1.3 x 2",
    "LoRA 1.5B frozen bf16 base (GB)": "1.51B x 2 bytes",
    "1.5B b2 activations x1.3 (GB)": "2.72 GB x 1.3",
    "12 GB table: full fine-tune 0.12B, b=16 (GB)": "0.8 + 1.97 + 7.25 + 0.82",
}
CURRICULUM = [  # (figure, value from the calculator in the printed unit, as printed)
    ("activations/layer h768 s512 b8 (MB)", E.activation_bytes_per_layer(512, 8, 768, 12) / E.MB, "232.8"),
    ("activations 12 layers (GB)", 12 * E.activation_bytes_per_layer(512, 8, 768, 12) / E.GB, "2.79"),
    ("logits b8 s512 V50k (GB)", E.logits_bytes(8, 512, 50_000) / E.GB, "0.41"),
    ("params h768 L12 V50k (M)", E.decoder_params(768, 12, 50_000) / 1e6, "123"),
    ("params h1024 L24 V50k (M)", E.decoder_params(1024, 24, 50_000) / 1e6, "353"),
    ("params h2048 L24 V150k (B)", E.decoder_params(2048, 24, 150_000) / 1e9, "1.51"),
    ("AdamW states 0.1B (GB)", E.model_state_bytes(1e8, "fp32-adamw") / E.GB, "1.6"),
    ("ViT-tiny layer b64 (MB)", E.activation_bytes_per_layer(197, 64, 192, 3) / E.MB, "119.6"),
    ("text-tower layer b64 (MB)", E.activation_bytes_per_layer(128, 64, 384, 6) / E.MB, "138.4"),
    ("0.12B states (GB)", E.estimate_training(**E.SHAPE_012B, seq=512, batch=8).states / E.GB, "1.97"),
    ("0.12B b8 activations x1.3 (GB)", E.estimate_training(**E.SHAPE_012B, seq=512, batch=8).activations / E.GB,
     "3.63"),
    ("0.12B b16 activations x1.3 (GB)", E.estimate_training(**E.SHAPE_012B, seq=512, batch=16).activations / E.GB,
     "7.25"),
    ("0.35B states (GB)", E.estimate_training(**E.SHAPE_035B, seq=512, batch=2).states / E.GB, "5.65"),
    ("0.35B b2 activations x1.3 (GB)", E.estimate_training(**E.SHAPE_035B, seq=512, batch=2).activations / E.GB,
     "2.42"),
    ("LoRA 0.5B frozen bf16 base (GB)", E.model_state_bytes(0.5e9, trainable=0) / E.GB, "1.0"),
    ("LoRA 0.5B 3M trainable (GB)", E.model_state_bytes(3e6) / E.GB, "0.05"),
    ("LoRA 1.5B frozen bf16 base (GB)", E.model_state_bytes(E.decoder_params(2048, 24, 150_000), trainable=0) / E.GB,
     "3.02"),
    ("LoRA 1.5B 9M trainable (GB)", E.model_state_bytes(9e6) / E.GB, "0.14"),
    ("1.5B b2 activations x1.3 (GB)", E.estimate_training(**E.SHAPE_15B, seq=512, batch=2).activations / E.GB,
     "3.54"),
    ("1.5B b2 logits (GB)", E.logits_bytes(2, 512, 150_000) / E.GB, "0.31"),
    ("7B full fine-tune states (GB)", E.model_state_bytes(7e9, "bf16-master-adamw") / E.GB, "112"),
    ("7B ZeRO-3 x8 per GPU (GB)", E.zero_per_gpu(7e9, 8) / E.GB, "14.0"),
    ("KV 32L 8kv d128 bf16, 8K (GiB)", E.kv_cache_bytes(32, 8, 128, 8192) / E.GiB, "1.00"),
    ("KV 32L 8kv d128 bf16, 32K (GiB)", E.kv_cache_bytes(32, 8, 128, 32768) / E.GiB, "4.00"),
    ("KV 32L 8kv d128 bf16, 128K (GiB)", E.kv_cache_bytes(32, 8, 128, 131072) / E.GiB, "16.00"),
    ("FLOPs LoRA 1.5B b2 s512 (TFLOP/step)", E.training_flops(E.decoder_params(2048, 24, 150_000), 1024) / 1e12,
     "9.3"),
    ("FLOPs 0.12B b8 s512 (TFLOP/step)", E.training_flops(E.decoder_params(768, 12, 50_000), 4096) / 1e12, "3.0"),
    ("FLOPs two towers per sample (GFLOP)", (E.training_flops(5.7e6, 197) + E.training_flops(22e6, 128)) / 1e9,
     "23.6"),
] + [(f"12 GB table: {scenario} (GB)", E.estimate_training(seq=512, **kwargs).total / E.GB, str(printed))
     for scenario, kwargs, printed in E.TABLE_12GB if isinstance(printed, float)]


@pytest.mark.parametrize("figure, calculated, printed", CURRICULUM, ids=[c[0] for c in CURRICULUM])
def test_calculator_reproduces_curriculum_figure(figure, calculated, printed):
    gates.check(f"memcalc {figure}: |calc - {printed}|", abs(calculated - float(printed)), "<=",
                printed_tolerance(printed, from_rounded=figure in ROUNDED))


def test_full_fine_tune_of_1_5b_cannot_fit_12gb():
    states = memcalc.estimate_training(**memcalc.SHAPE_15B, seq=512, batch=1).states / memcalc.GB
    gates.check("1.5B full fine-tune: model states alone (GB)", states, ">", 12.0)


def test_calculator_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown training setup"):
        memcalc.model_state_bytes(1e9, "adam")
    with pytest.raises(ValueError, match="batch must be positive"):
        memcalc.estimate_training(768, 12, 12, 512, 0, 50_000)


def test_calculator_cli_prints_the_12gb_table(capsys):
    memcalc.main(["table"])
    assert len(capsys.readouterr().out.splitlines()) == 2 + len(memcalc.TABLE_12GB)  # header, separator, rows


# --- CUDA: the same claims read from the caching allocator -------------------------------------------------
@pytest.fixture(scope="module")
def cuda_model():
    m = day.TinyGPT(day.GPTConfig()).cuda()
    day.loss_in_mode(m, *day.make_batch(m.cfg, 2, "cuda"), "fp32").backward()  # warm-up: cuBLAS workspace
    m.zero_grad(set_to_none=True)
    return m


@pytest.mark.gpu
def test_cuda_peak_memory_doubles_with_batch(cuda_model):
    peaks = [day.cuda_peak_bytes(cuda_model, b, "fp32") for b in (16, 32, 64)]
    gates.check("CUDA worst |peak(2b)/peak(b) - 2|, b=16,32,64", worst_doubling_error(peaks), "<=", 0.1)


@pytest.mark.gpu
def test_cuda_checkpointing_cuts_peak_by_half(cuda_model):
    plain, ckpt = (day.cuda_peak_bytes(cuda_model, 64, mode) for mode in day.MODES[:2])
    gates.check("CUDA checkpointing: peak cut at b=64", 1 - ckpt / plain, ">=", 0.5)


@pytest.mark.gpu
def test_cuda_megatron_formula_accounts_for_every_byte():
    rows = day.megatron_check(day.GPTConfig(), batches=(4, 8), device="cuda")
    gates.check("CUDA Megatron + LayerNorm stats: worst |ratio-1|", max(abs(r["explained_ratio"] - 1) for r in rows),
                "<=", 0.03)


@pytest.mark.gpu
def test_cuda_model_states_match_the_calculator():
    # h=512 makes weights dominate: activations at b=1, s=64 are ~1% of the 16 bytes/parameter.
    states = day.cuda_model_states(day.GPTConfig(hidden=512, heads=8), batch=1)
    gates.check("CUDA model states measured/predicted: |ratio-1|", abs(states["measured"] / states["predicted"] - 1),
                "<=", 0.05)


if __name__ == "__main__":
    run_this_file(__file__)
