"""The FL victim: one client's local round (:func:`simulate_client`) and a server loop (:func:`run_federation`).

Local training is :func:`gi.world.fl.local.local_train` on the client's real data, so the closed forms of RLU Table 1
hold exactly for the bias of the last layer: the optimiser rules of :mod:`gi.world.fl.optim` (RLU A.4, A.5) and the
scheme terms of :mod:`gi.world.fl.schemes` (A.6–A.9). RLU's "local epochs" are local *steps* on fresh batches (its
eq. 5 and its public code): ``protocol.local_steps`` caps training at that many steps, otherwise the client runs
``local_epochs`` full passes (:func:`gi.world.fl.local.local_schedule`, which the attack side derives too).

The capture carries the global model θᵗ, the update ``Δθ = θ_local − θᵗ`` (after the protocol's defences,
:mod:`gi.world.fl.defences`, recorded in ``capture.meta["defences"]``), the protocol with ``num_samples = N_k`` and the
scheme's history terms (``capture.history``, keys ``"<term>/<param>"``, see :attr:`gi.world.fl.schemes.Scheme.history`).
The truth carries the label counts of the distinct samples used, and in ``truth.extra`` the per-step and per-epoch
counts and the per-step cross-entropy bias gradient.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from gi.capture import Capture, Truth, describe_model, state_of
from gi.core.devices import torch_device
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl import defences
from gi.world.fl.defences.secagg import pool_group
from gi.world.fl.local import local_schedule, local_train
from gi.world.fl.protocol import Protocol
from gi.world.fl.schemes import SCHEMES, get_scheme
from gi.world.losses import as_soft_targets, check_class_ids, loss_for
from gi.world.models import builder_of

log = logging.getLogger("gi.world.fl.victim")
_DROPS_NOTED: set[tuple[int, int]] = set()  # (N, B) pairs whose drop_last notice was logged

Tensor = torch.Tensor
State = dict[str, Tensor]


# --------------------------------------------------------------------------- data access
def _as_arrays(dataset: Any) -> tuple[Tensor, Tensor, int]:
    """``(images, labels, num_classes)`` from a :class:`gi.world.data.ImageDataset` or an ``(images, labels)`` pair."""
    if isinstance(dataset, tuple | list) and len(dataset) == 2:
        images, labels = dataset
        return images, labels.long(), int(labels.max()) + 1
    images, labels = getattr(dataset, "images", None), getattr(dataset, "labels", None)
    if images is None or labels is None:
        raise ConfigError(f"dataset must have .images and .labels (or be an (images, labels) pair), got "
                          f"{type(dataset).__name__}")
    num_classes = int(getattr(dataset, "num_classes", int(labels.max()) + 1))
    return images, labels.long(), num_classes


# --------------------------------------------------------------------------- one client
@dataclass
class ClientRun:
    """Everything one client's local round produced (the clean update, before any DP noise)."""

    update: State
    num_samples: int
    step_counts: Tensor  # (S, C)
    step_bias_grad: Tensor | None  # (S, C) cross-entropy gradient of the last bias per step
    indices_used: Tensor  # dataset indices of the distinct samples used
    epoch_of_step: Tensor  # (S,)
    final_loss: float
    buffers: State = field(default_factory=dict)  # the buffers after the round (train mode: BatchNorm's running stats)


def _targets(labels: Tensor, num_classes: int, protocol: Protocol, dtype: torch.dtype) -> Tensor:
    """The client's soft targets per ``protocol.label_aug`` (:func:`gi.world.data.make_targets`; mixup needs pairs)."""
    from gi.world.data import make_targets

    if protocol.label_aug == "mixup":
        raise ConfigError("protocol.label_aug='mixup' is not supported for local training; valid: "
                          "['onehot', 'smoothing', 'smoothing-alt']")
    if protocol.label_aug != "onehot" and protocol.label_eps is None:
        raise ConfigError(f"protocol.label_aug={protocol.label_aug!r} in local training smooths every sample with one "
                          "ε: set protocol.label_eps (in [0, 1)); without it the client would train one-hot")
    kind = "onehot" if not protocol.label_eps else protocol.label_aug
    return make_targets(labels, num_classes, kind, protocol.label_eps, dtype=dtype)


def dropped_notice(protocol: Protocol, num_samples: int) -> str | None:
    """The notice for a client whose epochs leave samples out: ``drop_last`` with a batch size that does not divide
    its N (and is below it) never trains on N mod B of them in each epoch (reshuffled, a different few each time),
    where a ``DataLoader(shuffle=True)`` keeps the short batch unless told to drop it. None where nothing is left."""
    b = int(protocol.batch_size)
    if not protocol.drop_last or num_samples <= b or not num_samples % b:
        return None
    return (f"protocol.drop_last: each local epoch trains on {num_samples - num_samples % b} of the client's "
            f"{num_samples} samples and leaves {num_samples % b} out (B = {b} does not divide N); a "
            "DataLoader(shuffle=True) client keeps the short batch: protocol.drop_last=false")


def note_dropped(protocol: Protocol, num_samples: int) -> None:
    """Log :func:`dropped_notice` once per (N, B) in this process (a federation's clients would repeat it)."""
    notice = dropped_notice(protocol, num_samples)
    key = (num_samples, int(protocol.batch_size))
    if notice is not None and key not in _DROPS_NOTED:
        _DROPS_NOTED.add(key)
        log.warning(notice)


def _train_client(
    model: torch.nn.Module,
    images: Tensor,
    labels: Tensor,
    num_classes: int,
    protocol: Protocol,
    generator: torch.Generator | None,
    history: State,
    last_layer: str = "fc",
) -> ClientRun:
    """Local training of one client from the model's current weights (θᵗ); the model is not modified. The
    protocol's defences act on its data, model, batches and steps (:mod:`gi.world.fl.defences`)."""
    if not protocol.is_update:
        raise ConfigError(f"gi.world.fl.victim trains update-sharing schemes; protocol.scheme={protocol.scheme!r} "
                          "is not "
                          f"one of {sorted(n for n, s in SCHEMES.items() if s.shares == 'update')} (FedSGD "
                          "captures come from gi.capture_gradients)")
    ctx = defences.Context(protocol, generator)
    originals = int(labels.shape[0])
    keep = defences.data_indices(labels, ctx)
    if keep is not None:  # the client trains on (and reports) its defended set; the truth keeps the originals
        images, labels = images[keep], labels[keep]
    n = int(labels.shape[0])
    schedule = local_schedule(protocol, n)
    note_dropped(protocol, n)
    local = copy.deepcopy(model)
    local.train(protocol.model_mode == "train")
    names = [k for k, p in local.named_parameters() if p.requires_grad]
    every = dict(local.named_parameters())
    theta0 = {k: every[k].detach().clone() for k in names}
    loss_fn = loss_for(protocol)
    bias_idx = names.index(f"{last_layer}.bias") if f"{last_layer}.bias" in names else None

    step_counts = torch.zeros(len(schedule), num_classes, dtype=torch.long)
    bias_grads = torch.zeros(len(schedule), num_classes, dtype=torch.float64) if bias_idx is not None else None
    epoch_of_step = torch.zeros(len(schedule), dtype=torch.long)
    used = torch.zeros(originals, dtype=torch.bool)
    order = {"perm": torch.randperm(n, generator=generator), "pos": 0, "epoch": 0}
    last_loss = [torch.zeros(())]

    def gradient(theta: State, step: int) -> State:
        size = schedule[step]
        if order["pos"] + size > n:  # next epoch: reshuffle
            order.update(perm=torch.randperm(n, generator=generator), pos=0, epoch=order["epoch"] + 1)
        idx = order["perm"][order["pos"]:order["pos"] + size]
        order["pos"] += size
        used[idx if keep is None else keep[idx]] = True
        y = labels[idx]
        step_counts[step] = torch.bincount(y, minlength=num_classes)
        epoch_of_step[step] = order["epoch"]
        ctx.batch_size = size
        targets = _targets(y, num_classes, protocol, images.dtype).to(images.device)
        loss, clean, grads = defences.defended_gradient(lambda p, x: functional_call(local, p, (x,)), theta,
                                                        images[idx], targets, loss_fn, ctx)
        if bias_grads is not None:
            bias_grads[step] = clean[names[bias_idx]].double().cpu()
        if not math.isfinite(float(loss)):
            raise CaptureError("client loss became NaN/Inf during local training; lower protocol.lr")
        last_loss[0] = loss
        return grads

    with torch.no_grad(), defences.model_defences(local, ctx):
        theta = local_train(theta0, protocol, len(schedule), gradient, history)
    update = {k: (theta[k] - theta0[k]).cpu() for k in names}
    # a FedAvg client sends its state_dict: in train mode its BatchNorm buffers moved with the batches it saw
    buffers = {k: b.detach().clone().cpu() for k, b in local.named_buffers()} if local.training else {}
    return ClientRun(update=update, num_samples=n, step_counts=step_counts, step_bias_grad=bias_grads,
                     indices_used=torch.nonzero(used).flatten(), epoch_of_step=epoch_of_step,
                     final_loss=float(last_loss[0]), buffers=buffers)


def _history_for(protocol: Protocol, history: State | None, params: State) -> State:
    """The server-known history terms of this scheme (zeros when a term is absent: first round)."""
    out: State = {}
    history = history or {}
    for term in get_scheme(protocol.scheme).history:
        for name, p in params.items():
            t = history.get(f"{term}/{name}")
            out[f"{term}/{name}"] = torch.zeros_like(p) if t is None else t.detach().clone().to(p.dtype)
    return out


def _make_capture(model: torch.nn.Module, run: ClientRun, protocol: Protocol, history: State,
                  generator: torch.Generator | None, meta: dict[str, Any], state: State | None = None,
                  described: tuple[dict[str, Any], str] | None = None) -> Capture:
    """The capture of one client's round; ``state`` (θᵗ) may be shared by all clients of the round;
    ``described``: the model's ``(spec, last layer)`` (:func:`gi.capture.describe_model`)."""
    spec, last_layer = described if described is not None else describe_model(model)
    proto = dataclasses.replace(protocol, num_samples=run.num_samples)
    if state is None:
        state = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
    steps = int(run.step_counts.shape[0])
    meta = {"num_samples": run.num_samples, "num_steps": steps, "labelled_samples": int(run.step_counts.sum()), **meta}
    if defences.specs(proto):  # which defences, and the privacy spent over the rounds so far (one client per round)
        rate = min(int(proto.batch_size), run.num_samples) / run.num_samples
        meta["defences"] = defences.record(proto, steps * int(meta.get("round", 1)), rate)
    return Capture(model_spec=dict(spec), model_state=state, protocol=proto,
                   update=defences.apply("shared", run.update, defences.Context(proto, generator)), history=history,
                   meta=meta, buffers=run.buffers, last_layer_name=last_layer, factory=builder_of(model))


def _make_truth(images: Tensor, labels: Tensor, num_classes: int, run: ClientRun, indices: Tensor,
                keep_images: bool) -> Truth:
    used = run.indices_used
    y = labels[used]
    imgs = images[used].detach().clone() if keep_images else images[:0].detach().clone()
    epochs = int(run.epoch_of_step.max()) + 1 if len(run.epoch_of_step) else 0
    epoch_counts = torch.zeros(epochs, num_classes, dtype=torch.long).index_add_(0, run.epoch_of_step,
                                                                                 run.step_counts)
    extra = {"step_counts": run.step_counts, "epoch_counts": epoch_counts, "indices": indices[used]}
    if run.step_bias_grad is not None:
        extra["step_bias_grad"] = run.step_bias_grad
    return Truth(images=imgs, labels=y, targets=F.one_hot(y, num_classes).float(),
                 counts=torch.bincount(y, minlength=num_classes), extra=extra,
                 meta={"final_loss": run.final_loss, "labelled_counts": run.step_counts.sum(0).tolist()})


def simulate_client(
    model: torch.nn.Module,
    dataset: Any,
    protocol: Protocol,
    rng: torch.Generator | None = None,
    indices: Tensor | Sequence[int] | None = None,
    history: State | None = None,
    keep_images: bool = True,
    meta: dict[str, Any] | None = None,
    last_layer: str | None = None,
    device: str | torch.device | None = None,
) -> tuple[Capture, Truth]:
    """One FL client's local round from the global model ``model`` (θᵗ) (docs/architecture.md, "Public contract").

    ``model`` is any classifier ``nn.Module``: its last ``nn.Linear`` is found (or named by ``last_layer``) and its
    provenance recorded (:func:`gi.capture.describe_model`). ``device`` (``cpu``, ``gpu``, ``cuda:N``, ``auto``) runs
    the local training there, on a copy of the model; the capture is kept on the CPU.

    ``dataset``: a ``gi.world.data`` dataset (``.images`` in [0, 1], ``.labels``, ``.num_classes``) or an
    ``(images, labels)`` pair; ``indices`` the client's samples (default: all). ``history``: the scheme's
    state at the start of the round, keys ``"<term>/<param>"`` of its ``Scheme.history`` (absent = zero,
    the first round). ``rng`` shuffles the batches and draws DP noise. Returns ``(Capture, Truth)``;
    ``truth.counts`` counts the distinct samples the update depends on, ``truth.extra['step_counts']``
    the labels of every step (their sum is what RLU estimates).
    """
    run_device = torch_device(device) if device is not None else None
    images, labels, num_classes = _as_arrays(dataset)
    if images.ndim != 4:
        raise CaptureError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    if images.min() < 0 or images.max() > 1:
        raise CaptureError("images must be pixels in [0, 1]; normalisation is the model's first layer")
    described = describe_model(model, last_layer, example=images[:1].to(next(iter(model.parameters())).device))
    data_classes, num_classes = num_classes, int(described[0]["num_classes"])
    indices = torch.arange(len(labels)) if indices is None else torch.as_tensor(indices, dtype=torch.long)
    if indices.numel() == 0:
        raise CaptureError("client has no samples (empty indices)")
    check_class_ids(labels[indices], num_classes, data_classes)
    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    hist = _history_for(protocol, history, params)
    worker, x, h = model, images[indices], hist
    if run_device is not None and torch.device(run_device) != next(iter(model.parameters())).device:
        worker, x = copy.deepcopy(model).to(run_device), x.to(run_device)
        h = {k: v.to(run_device) for k, v in hist.items()}
    run = _train_client(worker, x, labels[indices], num_classes, protocol, rng, h, described[1])
    capture = _make_capture(model, run, protocol, hist, rng, dict(meta or {}), described=described)
    truth = _make_truth(images[indices], labels[indices], num_classes, run, indices, keep_images)
    return capture, truth


# --------------------------------------------------------------------------- server loop
@dataclass
class Federation:
    """Result of :func:`run_federation`.

    ``global_states[t]`` is θᵗ (the model broadcast in round t, rounds start at 1: θ¹ is the
    initialisation); ``captures`` holds ``(round, client, Capture, Truth)`` for the requested rounds and
    clients; ``accuracy[t]`` is the accuracy of θᵗ on the evaluation data when given.
    """

    partition: list[Tensor]
    global_states: dict[int, State] = field(default_factory=dict)
    captures: list[tuple[int, int, Capture, Truth]] = field(default_factory=list)
    accuracy: dict[int, float] = field(default_factory=dict)
    client_states: dict[int, State] = field(default_factory=dict)

    def model(self, template: torch.nn.Module, round: int) -> torch.nn.Module:
        """A copy of ``template`` carrying θ^round."""
        m = copy.deepcopy(template)
        m.load_state_dict(self.global_states[round])
        return m


@torch.no_grad()
def _accuracy(model: torch.nn.Module, images: Tensor, labels: Tensor, batch: int = 1000) -> float:
    model.eval()
    correct = sum(int((model(images[i:i + batch]).argmax(1) == labels[i:i + batch]).sum())
                  for i in range(0, len(labels), batch))
    return correct / max(len(labels), 1)


def _client_partition(labels: Tensor, num_clients: int, alpha: float | None, rng: torch.Generator | None,
                      partition: Sequence[Tensor] | None, min_size: int | None) -> list[Tensor]:
    """The clients' index tensors: ``partition`` as given, else a Dirichlet(``alpha``) split of ``labels``."""
    if partition is None:
        if alpha is None:
            raise ConfigError("run_federation needs alpha (Dirichlet concentration) or an explicit partition")
        from gi.world.fl.partition import dirichlet_partition

        kwargs = {} if min_size is None else {"min_size": min_size}
        partition = dirichlet_partition(labels, num_clients, alpha, rng, **kwargs)
    out = [torch.as_tensor(p, dtype=torch.long) for p in partition]
    if len(out) != num_clients:
        raise ConfigError(f"partition has {len(out)} clients, num_clients={num_clients}")
    return out


def run_federation(
    model: torch.nn.Module,
    dataset: Any,
    protocol: Protocol,
    num_clients: int,
    rounds: int,
    alpha: float | None,
    rng: torch.Generator | None = None,
    partition: Sequence[Tensor] | None = None,
    capture_rounds: Sequence[int] = (),
    capture_clients: Sequence[int] | None = None,
    eval_data: Any = None,
    keep_states: str = "captured",
    keep_images: bool = False,
    min_size: int | None = None,
) -> Federation:
    """FedAvg-style training of ``model`` (θ¹) over ``rounds`` rounds with all clients participating.

    Clients are a Dirichlet(``alpha``) partition of ``dataset`` (``gi.world.fl.partition.dirichlet_partition``) unless
    ``partition`` (a list of index tensors) is given. Aggregation is the size-weighted mean of the local
    models (McMahan 2017, RLU eq. 1); FedDyn adds its server state ``θ ← mean θ_k − h/α``
    (Acar et al. 2021), FedDC adds the mean drift (Gao et al. 2022), Scaffold updates the server
    control variate by the mean of the client control changes. Captures (with DP noise, if the
    protocol asks for it) are taken at ``capture_rounds`` for ``capture_clients`` (default all); the
    server's own aggregation uses the noisy updates too, as a real server would. Under secure aggregation
    (``secagg`` of k) a capture is the merged message of clients ``[c, c + k)``
    (``gi.world.fl.defences.secagg.pool_group``), listed under its first client. ``keep_states``:
    ``"captured"`` keeps θᵗ of the captured rounds, ``"all"`` of every round (plus θ^{rounds+1}). The
    captures of one round share one ``model_state`` dict (θᵗ): treat it as read-only.
    """
    images, labels, num_classes = _as_arrays(dataset)
    partition = _client_partition(labels, num_clients, alpha, rng, partition, min_size)
    if keep_states not in ("captured", "all"):
        raise ConfigError(f"keep_states={keep_states!r}; valid: ['all', 'captured']")
    capture_rounds = set(int(r) for r in capture_rounds)
    capture_clients = set(range(num_clients)) if capture_clients is None else set(int(c) for c in capture_clients)
    sizes = torch.tensor([len(p) for p in partition], dtype=torch.float64)
    weights = sizes / sizes.sum()
    glob = copy.deepcopy(model)
    described = describe_model(glob, example=images[:1])
    params = {k: p.detach() for k, p in glob.named_parameters() if p.requires_grad}
    states: dict[int, State] = {c: _history_for(protocol, None, params) for c in range(num_clients)}
    scheme = get_scheme(protocol.scheme, shares="update")
    server: State = {}  # the scheme's server state (FedDyn's h)
    group = defences.group_size(protocol)  # secure aggregation: the server sees groups of clients only
    fed = Federation(partition=partition)
    for t in range(1, rounds + 1):
        if keep_states == "all" or t in capture_rounds:
            fed.global_states[t] = {k: v.detach().clone() for k, v in glob.state_dict().items()}
        if eval_data is not None:
            ev_images, ev_labels, _ = _as_arrays(eval_data)
            fed.accuracy[t] = _accuracy(glob, ev_images, ev_labels)
        shared: list[State] = []
        round_state = {k: v.detach().clone() for k, v in glob.state_dict().items()}  # θᵗ, shared by the captures
        seen: dict[int, tuple[Capture, Truth]] = {}
        for c, idx in enumerate(partition):
            hist = states[c]
            run = _train_client(glob, images[idx], labels[idx], num_classes, protocol, rng, hist, described[1])
            capture = _make_capture(glob, run, protocol, hist, rng, {"round": t, "client": c}, round_state,
                                    described)
            first = c - c % group
            if t in capture_rounds and capture_clients.intersection(range(first, first + group)):
                seen[c] = (capture, _make_truth(images[idx], labels[idx], num_classes, run, idx, keep_images))
            shared.append(capture.update)
            states[c] = hist if scheme.client_state is None else scheme.client_state(protocol, hist, run.update,
                                                                                      len(run.step_counts))
        for first in sorted({c - c % group for c in seen}):  # secure aggregation: one sum per group of clients
            members = [seen[m] for m in range(first, min(first + group, num_clients))]
            fed.captures.append((t, first, *pool_group(members)))
        _aggregate(glob, protocol, shared, weights, states, server)
    if keep_states == "all":
        fed.global_states[rounds + 1] = {k: v.detach().clone() for k, v in glob.state_dict().items()}
    if eval_data is not None:
        ev_images, ev_labels, _ = _as_arrays(eval_data)
        fed.accuracy[rounds + 1] = _accuracy(glob, ev_images, ev_labels)
    fed.client_states = states
    return fed


@torch.no_grad()
def _aggregate(glob: torch.nn.Module, protocol: Protocol, shared: list[State], weights: Tensor,
               states: dict[int, State], server: State) -> None:
    """θ^{t+1} from the round's shared updates and the scheme's aggregation rule, in place."""
    avg = {k: sum(float(w) * u[k] for w, u in zip(weights, shared)) for k in shared[0]}
    steps = get_scheme(protocol.scheme).aggregate(protocol, avg, weights.tolist(), states, server)
    for name, p in glob.named_parameters():
        if name in steps:
            p.add_(steps[name].to(p.dtype))


def capture_gradients(
    model: torch.nn.Module,
    images: Tensor,
    targets: Tensor,
    protocol: Protocol,
    generator: torch.Generator | None = None,
    last_layer: str | None = None,
    device: str | torch.device | None = None,
) -> tuple[Capture, Truth]:
    """FedSGD: the client's gradient of the mean loss over one batch (docs/architecture.md, "Public contract").

    ``model`` is any classifier ``nn.Module`` (a zoo model or the user's own: its last ``nn.Linear`` is found, or
    named by ``last_layer``; its provenance is :func:`gi.world.models.spec_of`). ``targets`` are class ids ``(B,)`` or
    soft labels ``(B, C)``. The model is used in the protocol's mode (``eval`` by default, as Inverting Gradients
    assumes; ``protocol.model_mode="train"`` for batch statistics). ``device`` (``cpu``, ``gpu``, ``cuda:N``, ``auto``)
    runs the client's forward/backward there on a copy of the model (the capture is kept on the CPU).
    Returns ``(Capture, Truth)``.
    """
    if protocol.is_update:
        raise CaptureError(f"capture_gradients is FedSGD; protocol.scheme={protocol.scheme!r} needs "
                           "gi.simulate_client")
    target_device = torch_device(device) if device is not None else None
    if images.ndim != 4:
        raise CaptureError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    if images.shape[0] != targets.shape[0]:
        raise CaptureError(f"{images.shape[0]} images but {targets.shape[0]} targets")
    if images.min() < 0 or images.max() > 1:
        raise CaptureError("images must be pixels in [0, 1]; normalisation is the model's first layer")
    spec, name = describe_model(model, last_layer, example=images[:1].to(next(iter(model.parameters())).device))
    check_class_ids(targets, spec["num_classes"])
    if target_device is not None and torch.device(target_device) != next(iter(model.parameters())).device:
        model = copy.deepcopy(model).to(target_device)
    run_device = next(iter(model.parameters())).device
    soft = as_soft_targets(targets, spec["num_classes"])
    model.train(protocol.model_mode == "train")
    state = state_of(model)  # before BN updates
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    ctx = defences.Context(protocol, generator)  # the protocol's defences (gi.world.fl.defences), in their stages
    keep = defences.data_indices(soft.argmax(1), ctx)
    x, y = (images, soft) if keep is None else (images[keep], soft[keep])
    x, y = x.to(run_device), y.to(device=run_device, dtype=images.dtype)
    ctx.batch_size = int(x.shape[0])
    with defences.model_defences(model, ctx):
        loss, _, grads = defences.defended_gradient(lambda p, z: functional_call(model, p, (z,)), params, x, y,
                                                    loss_for(protocol), ctx)
    shared = defences.apply("shared", {n: g.detach().cpu() for n, g in grads.items()}, ctx)
    if not math.isfinite(float(loss)):
        raise CaptureError("client loss is not finite; check the model's initialisation and the inputs")
    meta: dict[str, Any] = {"num_samples": int(x.shape[0])}
    if defences.specs(protocol):
        n = protocol.num_samples or int(x.shape[0])
        meta["defences"] = defences.record(protocol, 1, int(x.shape[0]) / max(int(n), int(x.shape[0])))
    capture = Capture(model_spec=dict(spec), model_state=state, protocol=protocol, gradients=shared, meta=meta,
                      last_layer_name=name, factory=builder_of(model))
    counts = torch.bincount(soft.argmax(1), minlength=spec["num_classes"])
    truth = Truth(images=images.detach().clone().cpu(), labels=soft.argmax(1), targets=soft.detach().clone(),
                  counts=counts)
    return capture, truth
