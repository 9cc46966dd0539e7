"""The shards of the full generated suite (test_generated_project_slow.py) name files that the render
has, each once, so that the shards together run every test file exactly once."""

from __future__ import annotations

from collections import Counter

from test_generated_project_slow import CPU_ANSWERS, FULL_SUITE_MODEL_TYPE, FULL_SUITE_SHARDS, shard_files


def test_each_named_file_exists_once_and_the_last_shard_takes_the_rest(bake_ok):
    project = bake_ok(model_type=FULL_SUITE_MODEL_TYPE, **CPU_ANSWERS)
    files = {path.name for path in (project.path / "tests").glob("test_*.py")}
    named = Counter(name for names in FULL_SUITE_SHARDS.values() for name in names)
    assert [name for name, count in named.items() if count > 1] == []
    assert sorted(set(named) - files) == []
    catch_all = [shard for shard, names in FULL_SUITE_SHARDS.items() if not names]
    assert len(catch_all) == 1
    ignored = {arg.removeprefix("--ignore=tests/") for arg in shard_files(catch_all[0])[1:]}
    assert ignored == set(named)
    assert files - ignored, "the catch-all shard runs no file"
