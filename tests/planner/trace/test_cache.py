"""The trace cache: a model traced before is read back, the same; stale or broken entries miss."""

import json
import os

import pytest

from planner.api import prepare
from planner.trace import cache


def test_a_traced_model_is_read_back_the_same(tmp_path, tiny_llama_config, monkeypatch):
    from planner import traced

    folder = str(tmp_path / "traces")
    first = prepare(tiny_llama_config, seq_len=64, cache_dir=folder)
    assert len(os.listdir(folder)) == 1

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again instead of reading the cache")

    monkeypatch.setattr(traced, "trace_model", no_trace)
    again = prepare(tiny_llama_config, seq_len=64, cache_dir=folder)
    assert again.to_dict() == first.to_dict()
    # blocks copied from one layer still share one BlockWork (the search prices it once)
    assert len({id(b.work) for b in again.blocks.blocks}) == len(
        {id(b.work) for b in first.blocks.blocks})


def test_the_default_length_asked_for_by_number_reads_the_same_entry(tmp_path, tiny_llama_config,
                                                                    monkeypatch):
    """A config traced at its default length (no seq_len) is read back when its length is then
    given by number (plan show --why, the exports' memory check pass it); a zoo model's default
    and the same length by number share one key, either way round."""
    from planner import api, traced

    folder = str(tmp_path / "traces")
    first = prepare(tiny_llama_config, cache_dir=folder)

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again instead of reading the cache")

    monkeypatch.setattr(traced, "trace_model", no_trace)
    again = prepare(tiny_llama_config, seq_len=first.seq_len, cache_dir=folder)
    assert again.to_dict() == first.to_dict()
    with pytest.raises(AssertionError, match="traced again"):  # another length is another trace
        prepare(tiny_llama_config, seq_len=first.seq_len // 2, cache_dir=folder)
    calls = []
    monkeypatch.setattr(traced, "trace_model", lambda *a, **k: calls.append(a[2]) or first)
    prepare("gpt2", seq_len=api.ZOO["gpt2"].seq_len, cache_dir=folder)
    prepare("gpt2", cache_dir=folder)
    assert calls == [api.ZOO["gpt2"].seq_len]


def test_a_cached_trace_names_the_file_it_was_asked_for(tmp_path, tiny_llama_config):
    """The same bytes under another path hit the cache, and the plan must name the file that
    exists now (plan run builds the model from it), not the first one."""
    folder = str(tmp_path / "traces")
    first = prepare(tiny_llama_config, seq_len=64, cache_dir=folder)
    copy = tmp_path / "elsewhere" / "config.json"
    copy.parent.mkdir()
    copy.write_bytes(open(tiny_llama_config, "rb").read())
    again = prepare(str(copy), seq_len=64, cache_dir=folder)
    assert len(os.listdir(folder)) == 1  # read from the cache
    assert again.info["spec"] == str(copy)
    assert first.info["spec"] == tiny_llama_config


def test_keys_follow_what_the_trace_depends_on(tmp_path, tiny_llama_config):
    base = cache.key(tiny_llama_config, seq_len=64, dtype="bf16", method="auto")
    assert base and base == cache.key(tiny_llama_config, seq_len=64, dtype="bf16", method="auto")
    assert base != cache.key(tiny_llama_config, seq_len=32, dtype="bf16", method="auto")
    assert base != cache.key(tiny_llama_config, seq_len=64, dtype="fp32", method="auto")
    assert base != cache.key(tiny_llama_config, seq_len=64, dtype="bf16", method="fx")
    edited = tmp_path / "config.json"
    data = json.loads(open(tiny_llama_config).read())
    edited.write_text(json.dumps({**data, "num_hidden_layers": 5}))
    assert cache.key(str(edited), seq_len=64, dtype="bf16", method="auto") != base
    assert cache.key("gpt2", seq_len=None, dtype="bf16", method="auto")
    assert cache.key(object(), seq_len=None, dtype="bf16", method="auto") is None
    assert cache.key("missing.py:build", seq_len=None, dtype="bf16", method="auto") is None


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema": "other/v9"})])
def test_a_broken_entry_is_ignored_and_rewritten(tmp_path, tiny_llama_config, content):
    folder = tmp_path / "traces"
    folder.mkdir()
    entry = cache.key(tiny_llama_config, seq_len=64, dtype="bf16", method="auto")
    (folder / f"{entry}.json").write_text(content)
    p = prepare(tiny_llama_config, seq_len=64, cache_dir=str(folder))
    assert p.blocks.blocks and cache.load(str(folder), entry)["schema"] == cache.SCHEMA


def test_an_unwritable_cache_only_costs_the_cache(tmp_path, tiny_llama_config, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    p = prepare(tiny_llama_config, seq_len=64, cache_dir=str(blocker / "traces"))
    assert p.blocks.blocks and "cannot write" in caplog.text


def test_a_data_file_the_factory_reads_is_checked_when_the_entry_is_read(tmp_path, caplog):
    """A factory reading its sizes from a JSON file next to it: the entry records that file, is
    read back while the file stays the same, and misses once it changes (a new-user check kept
    planning the first sizes after editing the file); the model's own config and Python's files
    are not recorded."""
    import logging

    (tmp_path / "model.py").write_text(
        "import json, os, torch\n"
        "def build():\n"
        "    cfg = json.load(open(os.path.join(os.path.dirname(__file__), 'dims.json')))\n"
        "    w = cfg['width']\n"
        "    return torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.Linear(w, w)), "
        "(torch.randn(8, w),)\n")
    dims = tmp_path / "dims.json"
    dims.write_text('{"width": 64}')
    folder, spec = str(tmp_path / "traces"), f"{tmp_path / 'model.py'}:build"
    first = prepare(spec, cache_dir=folder)
    (entry,) = os.listdir(folder)
    with open(os.path.join(folder, entry)) as f:
        assert list(json.load(f)["reads"]) == [str(dims)]
    with caplog.at_level(logging.INFO, logger="planner"):
        assert prepare(spec, cache_dir=folder).info["num_params"] == first.info["num_params"]
        assert "traced before (trace cache)" in caplog.text
        dims.write_text('{"width": 128}')
        caplog.clear()
        again = prepare(spec, cache_dir=folder)
    assert f"trace cache: {dims} changed since the model was traced" in caplog.text
    assert again.info["num_params"] == 2 * (128 * 128 + 128) != first.info["num_params"]
    assert len(os.listdir(folder)) == 1  # the entry rewritten under the same key
    assert cache.read_signatures({str(tmp_path / "model.py"), os.__file__, "/proc/self/stat"}) \
        == {}
