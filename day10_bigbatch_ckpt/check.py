"""Day 10 gates: activations and the true peak grow linearly with the batch; checkpointing and bf16 shrink them (the
peak less than the saved bytes suggest); the largest batch that fits comes from the true peak; the memory calculator
answers every worked example of the curriculum's memory section from its command line; freezing and LoRA shrink
gradients and optimizer state as much as the trainable parameters.

Run:  python day10_bigbatch_ckpt/check.py   (or `pytest day10_bigbatch_ckpt`)
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day10_bigbatch_ckpt import formula_check, levers_lab
from day10_bigbatch_ckpt import main as day
from day10_bigbatch_ckpt import memcalc, memcalc_examples
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
BATCHES = (4, 8, 16)  # b, 2b, 4b
CKPT = "fp32 + checkpoint"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return day.TinyGPT(day.GPTConfig())


@pytest.fixture(scope="module")
def saved(model):
    """Bytes saved for backward, per mode and batch: one forward pass each."""
    return {mode: [day.saved_bytes(model, b, mode) for b in BATCHES] for mode in day.MODES}


@pytest.fixture(scope="module")
def peak(model):
    """True peak of forward + backward (live-allocation counter), per mode and batch."""
    return {mode: [day.peak_bytes(model, b, mode)[1] for b in BATCHES] for mode in day.MODES}


def worst_doubling_error(values) -> float:
    return max(abs(bigger / smaller - 2.0) for smaller, bigger in zip(values, values[1:]))


# --- bytes saved for backward (what is held between forward and backward) ---------------------------------
def test_doubling_the_batch_doubles_activation_memory(saved):
    gates.check("worst |saved(2b)/saved(b) - 2|, b=4,8,16", worst_doubling_error(saved["fp32"]), "<=", 0.1)


def test_checkpointing_cuts_activation_memory_by_half(saved):
    cut = 1 - saved[CKPT][-1] / saved["fp32"][-1]
    gates.check("checkpointing: saved-bytes cut at b=16", cut, ">=", 0.5)


def test_checkpointed_gradients_match_plain_ones(model):
    ratio = day.allclose_ratio(day.gradients(model, 8, CKPT), day.gradients(model, 8, "fp32"))
    gates.check("checkpointed grads: allclose ratio (<=1)", ratio, "<=", 1.0)


def test_bf16_autocast_saves_fewer_bytes_than_fp32(saved):
    gates.check("bf16/fp32 saved bytes at b=16", saved["bf16 autocast"][-1] / saved["fp32"][-1], "<", 1.0)


# --- the true peak over forward + backward (what decides an out-of-memory error) ---------------------------
def test_doubling_the_batch_doubles_the_true_peak(peak):
    gates.check("worst |peak(2b)/peak(b) - 2|, fp32, b=4,8,16", worst_doubling_error(peak["fp32"]), "<=", 0.1)


@pytest.mark.parametrize("mode", day.MODES)
def test_live_allocation_counter_agrees_with_the_profilers_allocation_record(model, peak, mode):
    profiler = day.profiler_peak_bytes(model, BATCHES[-1], mode)
    gates.check(f"{mode}: |counter / profiler peak - 1| at b=16", abs(peak[mode][-1] / profiler - 1), "<=", 0.01)


def test_checkpointed_peak_is_several_times_its_saved_bytes(saved, peak):
    # Saved bytes miss one block's forward temporaries and its recomputation in backward.
    gates.check("checkpointed: true peak / saved bytes at b=16", peak[CKPT][-1] / saved[CKPT][-1], ">=", 2.0)


def test_checkpointing_cuts_the_true_peak_by_the_curriculums_60_to_80_percent(peak):
    cut = 1 - peak[CKPT][-1] / peak["fp32"][-1]
    gates.check("checkpointing: true-peak cut at b=16 (>= 60%)", cut, ">=", 0.6)
    gates.check("checkpointing: true-peak cut at b=16 (<= 80%)", cut, "<=", 0.8)


def test_bf16_autocast_lowers_the_true_peak(peak):
    gates.check("bf16/fp32 true peak at b=16", peak["bf16 autocast"][-1] / peak["fp32"][-1], "<", 1.0)


@pytest.fixture(scope="module")
def largest(model):
    budget = 8 * day.MiB
    found = {}
    for figure, measure in (("saved", lambda b, m: day.saved_bytes(model, b, m)),
                            ("peak", lambda b, m: day.peak_bytes(model, b, m)[1])):
        for mode in day.MODES[:2]:
            b = day.largest_batch(lambda n, m=mode: measure(n, m), budget)
            assert measure(b, mode) <= budget < measure(b + 1, mode), (figure, mode, b)  # b fits, b + 1 does not
            found[figure, mode] = b
    return found


def test_checkpointing_fits_a_larger_batch_by_the_true_peak(largest):
    gates.check("largest batch in 8 MiB by true peak: checkpoint - plain",
                largest["peak", CKPT] - largest["peak", "fp32"], ">", 0)


def test_saved_bytes_overstate_the_checkpointed_batch_that_fits(largest):
    gates.check("largest checkpointed batch in 8 MiB: by true peak / by saved bytes",
                largest["peak", CKPT] / largest["saved", CKPT], "<", 0.5)


# --- Megatron's formula against the bytes one block saves ---------------------------------------------------
@pytest.fixture(scope="module")
def megatron():
    return formula_check.megatron_check(day.GPTConfig(), batches=(4, 8))


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


# --- the command line --------------------------------------------------------------------------------------
def test_main_writes_plot_and_tables(tmp_path):
    day.main(["--batches", "2", "4", "--budget-mib", "1", "--time-batch", "2", "--repeat", "2", "--layers", "2",
              "--out", str(tmp_path)])
    for name in ("memory_vs_batch.png", "memory_vs_batch.md", "memory_table_12gb.md", "memcalc_examples.md",
                 "summary.json"):
        assert (tmp_path / name).stat().st_size > 0, name


BAD_FLAGS = [["--time-batch", "0"], ["--repeat", "0"], ["--batches", "4", "0"], ["--budget-mib", "-1"],
             ["--budget-mib", "nan"], ["--layers", "0"], ["--device", "gpu"], ["--time-s", "1"]]
BAD_FLAGS += [] if torch.cuda.is_available() else [["--device", "cuda"]]  # a device this machine lacks


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=[" ".join(a) for a in BAD_FLAGS])
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


def test_the_command_line_prints_no_cuda_tooling_noise():
    # Importing the lesson must not drag in optional CUDA tooling (torch.utils.cpp_extension warns on CPU machines).
    done = subprocess.run([sys.executable, "-c", "import runpy, sys\nsys.argv = ['main.py', '--help']\n"
                           f"runpy.run_path({str(Path(day.__file__))!r}, run_name='__main__')"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


# --- the memory calculator: every worked example of the curriculum's memory section, from the CLI -----------
FIGURES = [(ex, f) for ex in memcalc_examples.EXAMPLES for f in ex.figures]


@pytest.fixture(scope="module")
def answers():
    """Each example's command line run once through memcalc's parser and calculator."""
    return {ex.cli: memcalc.calculate(ex.cli)[2] for ex in memcalc_examples.EXAMPLES}


@pytest.mark.parametrize("example, figure", FIGURES, ids=[f"{ex.name}: {f.what}" for ex, f in FIGURES])
def test_calculator_cli_reproduces_the_curriculums_figure(answers, example, figure):
    off, tolerance = memcalc_examples.miss(figure.value(answers[example.cli]), figure)
    gates.check(f"memcalc {example.cli.split()[0]} ({example.name}) {figure.what}: off from {figure.printed}", off,
                "<=", tolerance)


def test_the_12gb_table_has_a_row_for_every_scenario_of_the_curriculum(capsys):
    rows = memcalc.main(["table"])
    printed = capsys.readouterr().out.splitlines()
    gates.check("12 GB table rows printed", len(printed) - 2, "==", len(rows))
    gates.check("12 GB table rows", len(rows), ">=", 15)


@pytest.mark.parametrize("argv, field", [
    ("train --params=-5e9", "--params must be > 0"), ("train --params nan", "--params must be a finite"),
    ("train --params inf", "--params must be a finite"), ("train --heads 5", "--heads (5) must divide --hidden"),
    ("train --params 1e9 --trainable 2e9", "--trainable"), ("train --batch 0", "--batch must be > 0"),
    ("train --tflops 0", "--tflops"), ("train --dataset-size 0", "--dataset-size"),
    ("train --component vit:params=5e6,layers=2,hidden=100,heads=3", "heads (3) must divide hidden (100)"),
    ("train --component vit:layers=2", "--component"), ("kv --seq 0", "--seq"), ("zero --gpus 0", "--gpus"),
])
def test_calculator_rejects_a_bad_value_naming_the_field(argv, field, capsys):
    with pytest.raises(SystemExit) as exc:
        memcalc.main(argv.split())
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exc.value.code == 2 and len(errors) == 1 and field in errors[0], errors


# --- levers 4-6: freezing and LoRA (levers_lab.py) -----------------------------------------------------------
@pytest.fixture(scope="module")
def levers():
    return levers_lab.run_lab(levers_lab.Config(), eight_bit=False)  # AdamW8bit: the eight_bit fixture


def test_frozen_parameters_get_no_gradient_and_no_optimizer_state(levers):
    frozen = levers["frozen"]
    gates.check("frozen params with a gradient or optimizer state", frozen["frozen_with_grad"]
                + frozen["frozen_with_state"], "==", 0)


def test_optimizer_state_shrinks_with_the_trainable_parameters(levers):
    full, frozen = levers["full"], levers["frozen"]
    ratio = (frozen["state_bytes"] / full["state_bytes"]) / (frozen["trainable"] / full["trainable"])
    gates.check("frozen: |state-bytes share / trainable share - 1|", abs(ratio - 1), "<=", 0.02)
    gates.check("frozen: optimizer-state bytes / full fine-tune", frozen["state_bytes"] / full["state_bytes"], "<", 0.5)


def test_lora_trains_a_few_percent_of_the_parameters(levers):
    full, lora = levers["full"], levers["lora"]
    gates.check("LoRA trainable parameters = r*(in+out) summed", lora["trainable"], "==", levers["lora_formula"])
    gates.check("LoRA / full: trainable parameters", lora["trainable"] / full["trainable"], "<", 0.05)
    gates.check("LoRA / full: gradient bytes", lora["grad_bytes"] / full["grad_bytes"], "<", 0.05)
    gates.check("LoRA / full: optimizer-state bytes", lora["state_bytes"] / full["state_bytes"], "<", 0.05)
    gates.check("LoRA: frozen base params with a gradient or state", lora["frozen_with_grad"]
                + lora["frozen_with_state"], "==", 0)


def test_lora_starts_from_the_base_model_and_learns(levers):
    gates.check("LoRA before training: max |logits - base logits|", levers["lora_start_diff"], "==", 0.0)
    gates.check("LoRA: last / first training loss", levers["lora"]["last_loss"] / levers["lora"]["first_loss"], "<",
                0.9)


def test_merged_lora_weights_give_the_same_output_with_no_extra_parameters(levers):
    gates.check("merged vs adapter logits: allclose ratio (<= 1)", levers["merged_allclose_ratio"], "<=", 1.0)
    gates.check("merged model parameters - base model parameters", levers["merged_params"] - levers["base_params"],
                "==", 0)


# --- lever 6: 8-bit AdamW (torchao), measured -------------------------------------------------------------
@pytest.fixture(scope="module")
def eight_bit():
    """AdamW and torchao's AdamW8bit from the same weights, 4 steps each on the lab's batch; AdamW8bit eager (its
    compiled step would first compile for half a minute on a fresh machine: the same states, a faster step)."""
    cfg = levers_lab.Config()
    runs = {}
    for name, optimizer in (("adamw", torch.optim.AdamW), ("adamw8bit", levers_lab.adamw8bit())):
        torch.manual_seed(cfg.seed)
        model = day.TinyGPT(day.GPTConfig())
        runs[name] = levers_lab.train_and_count(model, 4, cfg.batch, cfg.lr, optimizer, eager=True)
    return runs


def test_8bit_adamw_keeps_its_states_in_under_2_5_bytes_per_parameter(eight_bit):
    full, q = eight_bit["adamw"], eight_bit["adamw8bit"]
    gates.check("AdamW8bit: optimizer-state bytes per parameter of the tiny GPT (its small tensors kept in fp32)",
                q["state_bytes"] / q["params"], "<=", 2.5)
    gates.check("torch AdamW: optimizer-state bytes per parameter, the 4-byte step counters left out",
                (full["state_bytes"] - 4 * full["tensors"]) / full["params"], "==", 8.0)


def test_8bit_states_are_the_calculators_2_bytes_plus_block_scales_code_maps_and_step_counters(eight_bit):
    q, codes = eight_bit["adamw8bit"], memcalc.SETUPS["amp-adamw8bit"][2]  # 2: m and v, 1 byte each
    n, tensors = q["quantised_params"], q["quantised_tensors"]  # torchao quantises whole blocks of 256 only
    expected = codes * n + 2 * 4 * n // 256 + tensors * (2 * 256 * 4 + 4)  # fp32 scale per 256, code map, step
    gates.check("AdamW8bit: state bytes of the quantised tensors / (the calculator's 2 bytes per parameter + fp32 "
                "block scales + code maps + step counters)", q["quantised_state_bytes"] / expected, "==", 1.0)


def test_8bit_adamw_trains_like_adamw(eight_bit):
    gates.check("loss after 4 steps from the same weights: |AdamW8bit / AdamW - 1|",
                abs(eight_bit["adamw8bit"]["last_loss"] / eight_bit["adamw"]["last_loss"] - 1), "<=", 0.02)


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
    rows = formula_check.megatron_check(day.GPTConfig(), batches=(4, 8), device="cuda")
    gates.check("CUDA Megatron + LayerNorm stats: worst |ratio-1|", max(abs(r["explained_ratio"] - 1) for r in rows),
                "<=", 0.03)


@pytest.mark.gpu
def test_cuda_model_states_match_the_calculator():
    # h=512 makes weights dominate: activations at b=1, s=64 are ~1% of the 16 bytes/parameter.
    states = formula_check.cuda_model_states(day.GPTConfig(hidden=512, heads=8), batch=1)
    gates.check("CUDA model states measured/predicted: |ratio-1|", abs(states["measured"] / states["predicted"] - 1),
                "<=", 0.05)


if __name__ == "__main__":
    run_this_file(__file__)
