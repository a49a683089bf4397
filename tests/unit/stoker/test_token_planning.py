"""`stoker plan --dataset tokens`: host cores and storage in tokens, checked against hand-computed cases."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stoker.token_planning import TokenPlanInput, describe_tokens, make_token_plan

LIMIT = "storage, not CPU, is the limit"


def _inp(**given) -> TokenPlanInput:
    return TokenPlanInput(**{"system": "h100", "per_core_rate": 5_000, "bytes_per_token": 2.0, **given})


def test_cores_for_one_and_n_h100s_follow_from_the_per_core_rate():
    plan = make_token_plan(_inp())
    one, eight = plan.feeds
    assert plan.model == "Llama 3.1 8B" and plan.accel_rate == 14_451
    # ceil(0.98 * 14,451 / 5,000) = ceil(2.83) = 3; ceil(0.98 * 115,608 / 5,000) = ceil(22.66) = 23
    assert (one.count, one.cores, eight.count, eight.cores) == (1, 3, 8, 23)
    assert one.stall == 0 and eight.stall == pytest.approx(1 - 115_000 / 115_608)  # 23 cores: 115,000 tokens/s
    assert one.storage_mbps == pytest.approx(14_451 * 2 / 1e6) and eight.storage_mbps == pytest.approx(0.23)
    assert not one.storage_bound and not eight.storage_bound and one.cores_online is None
    assert LIMIT not in describe_tokens(plan)


def test_tokenizing_online_adds_the_tokenizers_cpu_per_token():
    one, eight = make_token_plan(_inp(tokenize_rate=20_000)).feeds
    # a core makes 1 / (1/5,000 + 1/20,000) = 4,000 tokens/s tokenizing and packing
    assert (one.cores_online, eight.cores_online) == (4, 29)


def test_a_rate_measured_on_an_online_set_is_not_charged_the_tokenizer_twice():
    plan = make_token_plan(_inp(tokenize_rate=20_000, online=True))
    assert [f.cores_online for f in plan.feeds] == [None, None]
    assert [f.cores for f in plan.feeds] == [f.cores for f in make_token_plan(_inp()).feeds]
    assert "tokenizing is in the rate" in describe_tokens(plan) and "online instead" not in describe_tokens(plan)


def test_storage_is_named_as_the_limit_only_where_it_is():
    plan = make_token_plan(_inp(storage_mbps=0.2))  # 100,000 tokens/s at 2 bytes each
    one, eight = plan.feeds
    assert not one.storage_bound and eight.storage_bound  # 1 needs 14,162; 8 need 113,296
    assert eight.delivered == 100_000 and eight.stall == pytest.approx(1 - 100_000 / 115_608)
    assert eight.useful_cores == 20 and eight.cores == 23
    text = describe_tokens(plan)
    assert text.count(LIMIT) == 1 and text.index(LIMIT) > text.index("8 x h100")
    assert "0.2 MB/s gives 100,000 tokens/s of the 115,608 consumed, a stall of 13.5%" in text
    assert LIMIT not in describe_tokens(make_token_plan(_inp(storage_mbps=0.2, accelerators=1)))
    assert LIMIT not in describe_tokens(make_token_plan(_inp(storage_mbps=1.0)))  # 500,000 tokens/s: enough


def test_every_lm_profile_names_its_source_and_the_estimate_says_it_is_one():
    from stoker.accel.backends.profiles import token_rate

    h100, h200, b200 = (token_rate(name) for name in ("h100", "h200", "b200"))
    assert (h100.tokens_per_s, b200.tokens_per_s) == (14_451, 30_624)
    assert "Megatron-Bridge performance summary" in h100.source and "DGX-B200" in b200.source
    assert h200.source.startswith("estimate") and "6 x 8.03 B params" in h200.source and "MFU" in h200.source
    with pytest.raises(ValueError, match="no language-model rate"):
        make_token_plan(_inp(system="dgx-a100"))
    with pytest.raises(ValueError, match="bytes per token must be positive"):
        make_token_plan(_inp(bytes_per_token=0))


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker", "plan", "--dataset", "tokens", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def calibration(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({
        "tokens": {"per_core_rate": 5_000, "clock": "cpu", "unit": "tokens per CPU-second", "bytes_per_token": 2.0},
        "tokenize": {"per_core_rate": 20_000, "clock": "cpu", "unit": "tokens per CPU-second"}}))
    return cal


def test_plan_cli_answers_in_tokens_from_the_calibration(tmp_path, calibration):
    out = _plan("--calibration", str(calibration), "--json", str(tmp_path / "plan.json"))
    assert out.returncode == 0, out.stderr
    [plan] = json.loads((tmp_path / "plan.json").read_text())  # h100 when no --system is given
    assert plan["system"] == "h100" and plan["bytes_per_token"] == 2.0
    assert [(f["count"], f["cores"], f["cores_online"]) for f in plan["feeds"]] == [(1, 3, 4), (8, 23, 29)]
    assert "5,000 tokens per CPU-second per host core" in out.stdout and LIMIT not in out.stdout
    limited = _plan("--calibration", str(calibration), "--storage-mbps", "0.2", "--system", "h100")
    assert limited.returncode == 0 and limited.stdout.count(LIMIT) == 1, limited.stderr
    many = _plan("--calibration", str(calibration), "--system", "b200", "--accelerators", "64")
    assert "64 x b200: 385 host core(s)" in many.stdout, many.stdout  # ceil(0.98 * 64 * 30,624 / 5,000 = 384.2)


def test_plan_cli_refuses_nonsense_storage_and_flags_of_another_dataset(calibration):
    for bad in ("0", "-5", "nan", "inf", "fast"):
        out = _plan("--calibration", str(calibration), "--storage-mbps", bad)
        assert out.returncode == 2 and "argument --storage-mbps: must be a number > 0" in out.stderr, (bad, out)
    other = subprocess.run([sys.executable, "-m", "stoker", "plan", "--per-core-rate", "900", "--storage-mbps", "5"],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "give --dataset tokens" in other.stderr
    assert "leave out --check" in _plan("--per-core-rate", "5000", "--check").stderr
    missing = _plan("--calibration", str(calibration.with_name("none.json")))
    assert missing.returncode == 2 and "has no tokens rate" in missing.stderr


def test_plan_cli_reads_bytes_per_token_from_a_token_sets_manifest(tmp_path):
    from tests.token_corpus import prepared

    result, _, _ = prepared(tmp_path / "set")
    per_token = sum(s.num_bytes for s in result.manifest.shards) / result.tokens
    out = _plan("--per-core-rate", "5000", "--data", result.manifest.uri, "--json", str(tmp_path / "plan.json"))
    assert out.returncode == 0, out.stderr
    [plan] = json.loads((tmp_path / "plan.json").read_text())
    assert plan["bytes_per_token"] == pytest.approx(per_token) and per_token < 4  # zstd Parquet beats int32
    plain = _plan("--per-core-rate", "5000")
    assert "4 bytes per token (int32" in plain.stdout and "8.00 bytes" not in plain.stdout


def test_plan_without_a_calibration_says_in_one_line_the_calibrate_command_for_that_data_and_it_works(tmp_path):
    """No calibration file where `stoker plan --dataset tokens` looks: one line naming the file as missing and the
    `stoker calibrate --tokens MANIFEST` to run for the token set given; run as said, the plan then answers."""
    from tests.token_corpus import prepared

    result, _, _ = prepared(tmp_path / "set", count=60)
    manifest = result.manifest.uri

    def plan(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stoker", "plan", "--dataset", "tokens", *args],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    missing = plan("--data", manifest)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "stoker-calibration.json does not exist" in missing.stderr
    command = missing.stderr.split("run `", 1)[1].split("`", 1)[0]
    assert command == f"stoker calibrate --tokens {manifest}"
    elsewhere = plan("--calibration", str(tmp_path / "mine.json"))
    assert f"run `stoker calibrate --tokens MANIFEST --out {tmp_path / 'mine.json'}`" in elsewhere.stderr
    calibrate = subprocess.run([sys.executable, "-m", "stoker", *command.split()[1:], "--seconds", "1"],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert calibrate.returncode == 0, calibrate.stderr
    answered = plan("--data", manifest)
    assert answered.returncode == 0 and "tokens per CPU-second per host core" in answered.stdout, answered.stderr
