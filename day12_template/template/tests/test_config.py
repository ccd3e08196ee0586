"""The config's messages, checked without training: a mistyped section is matched to a section, a value given to a
section names one of its fields, the configs in normal use warn of nothing, and Muon is refused where it cannot
work."""
from pathlib import Path

import pytest

from train_template import config, train
from helpers import TEMPLATE, sets, tiny_lm


def refusal(tmp_path: Path, toml: str = "", overrides: tuple = ()) -> str:
    path = tmp_path / "run.toml"
    path.write_text(toml)
    with pytest.raises(config.ConfigError) as exc_info:
        config.load(str(path), list(overrides))
    return str(exc_info.value)


@pytest.mark.parametrize("where", ["toml", "--set"])
def test_a_mistyped_section_suggests_the_section_not_one_of_its_fields(where, tmp_path):
    toml, overrides = ("[trian]\nsteps = 3\n", ()) if where == "toml" else ("", ("trian=3",))
    assert refusal(tmp_path, toml, overrides) == "unknown config key `trian` (did you mean `train`?)"


def test_a_value_given_to_a_section_says_it_is_a_section_and_names_one_of_its_fields(tmp_path):
    message = refusal(tmp_path, overrides=("train=3",))
    assert message.startswith("`train` is a section of the config, not a field") and "train.steps" in message, message


TEXT_CONFIGS = sorted(p.name for p in (TEMPLATE / "configs").glob("*.toml")
                      if config.load(str(p), []).data.dataset in ("shakespeare", "tokens"))


@pytest.mark.parametrize("name", [*TEXT_CONFIGS, "tiny_lm"])
def test_the_shipped_text_configs_and_the_tests_tiny_lm_set_no_ignored_train_epochs(name, corpus):
    if name in TEXT_CONFIGS:
        cfg = config.load(str(TEMPLATE / "configs" / name), [])
    else:
        cfg = config.load(None, sets(tiny_lm(corpus)))
    assert config.ignored(cfg) == ""


def test_switching_the_dataset_warns_that_the_previous_datasets_table_is_ignored():
    cfg = config.load(str(TEMPLATE / "configs" / "shakespeare_cpu.toml"), ["data.dataset=tokens", "data.root=x"])
    assert config.ignored(cfg) == ("[data.shakespeare] (eval_windows=1024) is ignored: data.dataset is tokens, which "
                                   "reads [data.tokens]")


def test_muon_with_fsdp_is_refused_naming_both_fields(tmp_path):
    message = refusal(tmp_path, overrides=("optim.name=muon", "train.strategy=fsdp"))
    assert "optim.name=muon" in message and "train.strategy=fsdp" in message, message


def test_muon_for_a_model_of_convolutions_is_refused_before_the_run_writes_anything(tmp_path, capsys):
    """A ResNet's blocks hold 4-D kernels, which torch's Muon does not take: exit 2 and no run folder."""
    code = train.main(["--config", str(TEMPLATE / "configs/synthetic_smoke.toml"), "--set",
                       f"run.out_dir={tmp_path / 'run'}", "model.name=resnet", "optim.name=muon"])
    message = capsys.readouterr().err
    assert code == 2 and "use optim.name=adamw" in message and not (tmp_path / "run").exists(), message
