"""The model contract every fedray model follows: named feature taps and named split points.

A :class:`FedModel` is an ordinary ``torch.nn.Module`` whose forward pass is written down as an ordered
list of :class:`Segment` s. Each segment reads a few of the model's submodules (by dotted path), maps the
running tensor ``x`` to a tensor ``t``, may record ``t`` under one or more *tap* names, and may then apply
a post-activation (``x = post(t)``) before the next segment. This single description gives, without any
duplicated forward code:

- ``forward(x)``: run every segment;
- ``forward_features(x, taps)``: the same pass, also returning the requested taps (un-pooled maps or
  vectors). Recording a tap never changes the computation, so the logits are identical to ``forward``;
- ``embed(x)``: run up to the segment tapped ``"embedding"`` (the vector the classifier reads);
- ``split(point)``: a client part (segments up to and including the cut, with its post-activation) and a
  server part (the rest). Both parts register the *same* submodule objects as the model under the *same*
  dotted names, so their parameters are the model's tensors (training a part trains the model), their
  ``state_dict`` keys are a subset of the model's keys, and ``server(client(x))`` runs exactly the ops of
  ``forward(x)`` in the same order (bit-identical results).

Segment functions are module-level functions (or ``functools.partial`` of them) that receive a
*namespace* (the model, or a split part that carries the same attribute names) and the input, so models
and their parts pickle and deep-copy cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Segment", "FedModel", "SplitPart", "ProjectedModel", "WrappedModel", "pool_tap", "relu_post"]


def pool_tap(t: Tensor) -> Tensor:
    """Reduce a tapped feature to one vector per sample: (B, D).

    4-D maps (B, C, H, W) are global-average-pooled (``adaptive_avg_pool2d(t, 1)``, the op FedRCL and the
    ResNet heads use) to (B, C); 2-D tensors (B, D) are returned unchanged. FedRCL then L2-normalises
    the result in its loss.
    """
    if t.dim() == 4:
        return F.adaptive_avg_pool2d(t, 1).flatten(1)
    if t.dim() == 2:
        return t
    raise ValueError(f"pool_tap expects a (B, C, H, W) map or a (B, D) vector, got shape {tuple(t.shape)}")


def relu_post(ns: Any, t: Tensor) -> Tensor:
    """Post-activation used after pre-ReLU taps (ResNet stages, stems)."""
    return F.relu(t)


@dataclass(frozen=True)
class Segment:
    """One step of a model's forward pass.

    name:    the segment's name (unique within a model; split points name segments via their taps).
    modules: dotted paths of the submodules ``fn``/``post`` use (e.g. ``("conv1", "bn1")``,
             ``("backbone.layer1",)``). Every parameter of the model belongs to exactly one segment.
    fn:      ``fn(ns, x) -> t`` where ``ns`` exposes the submodules under the same attribute names;
             ``fn`` and ``post`` may read only the submodules listed in ``modules`` (a split part holds
             nothing else).
    taps:    names under which ``t`` is recorded by ``forward_features``.
    post:    optional ``post(ns, t) -> x`` applied after the taps are recorded (e.g. the ReLU after a
             pre-ReLU tap, or dropout after a fully connected layer).
    """

    name: str
    modules: tuple[str, ...]
    fn: Callable[[Any, Tensor], Tensor]
    taps: tuple[str, ...] = ()
    post: Callable[[Any, Tensor], Tensor] | None = None


def _run_segments(ns: Any, segments: Sequence[Segment], x: Tensor, want: set[str] | None,
                  out: dict[str, Tensor] | None) -> Tensor:
    for seg in segments:
        t = seg.fn(ns, x)
        if want is not None:
            for name in seg.taps:
                if name in want:
                    out[name] = t
        x = seg.post(ns, t) if seg.post is not None else t
    return x


class _Container(nn.Module):
    """A bare module used by :class:`SplitPart` to rebuild nested dotted paths (``backbone.layer1``)."""

    def forward(self, *args, **kwargs):  # pragma: no cover - never called
        raise RuntimeError("_Container only groups submodules of a split part; it has no forward")


def _attach(holder: nn.Module, model: nn.Module, segments: Sequence[Segment]) -> None:
    """Register the submodules the ``segments`` use, taken from ``model``, on ``holder`` under the same dotted
    names (nested paths through bare containers): the holder shares the model's tensors."""
    seen: list[str] = []
    for seg in segments:
        for path in seg.modules:
            if path not in seen:
                seen.append(path)
    for path in seen:
        module = model.get_submodule(path)
        *parents, leaf = path.split(".")
        node: nn.Module = holder
        for p in parents:
            child = node._modules.get(p)
            if child is None:
                child = _Container()
                node.add_module(p, child)
            node = child
        node.add_module(leaf, module)


class SplitPart(nn.Module):
    """The client-side or server-side part of a :class:`FedModel` cut at a split point.

    It holds the model's own submodule objects under the model's dotted names (parameters are shared, not
    copied) and runs the model's segments for its side. ``role`` is ``"client"`` or ``"server"``;
    ``point`` is the split-point name. Remember that ``train()``/``eval()`` on the model does not change
    the part's own flag, but layers whose behaviour depends on the mode (dropout, batch norm) are shared
    submodules, so their mode is whatever was set last on the model or on either part.
    """

    def __init__(self, model: "FedModel", segments: Sequence[Segment], role: str, point: str):
        super().__init__()
        self.role = role
        self.point = point
        self.model_name = getattr(model, "model_name", type(model).__name__)
        self._segments = tuple(segments)
        _attach(self, model, segments)
        self.feature_taps = tuple(t for seg in segments for t in seg.taps)

    def forward(self, x: Tensor) -> Tensor:
        return _run_segments(self, self._segments, x, None, None)

    def forward_features(self, x: Tensor, taps: Sequence[str] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Output of this part plus the taps that fall inside it (see :meth:`FedModel.forward_features`)."""
        want = _check_taps(self.feature_taps, taps, f"{self.role} part of {self.model_name!r}")
        feats: dict[str, Tensor] = {}
        out = _run_segments(self, self._segments, x, want, feats)
        return out, feats

    def extra_repr(self) -> str:
        return f"role={self.role!r}, point={self.point!r}"


def _check_taps(available: Sequence[str], taps: Sequence[str] | None, owner: str) -> set[str]:
    if taps is None:
        return set(available)
    if isinstance(taps, str):
        taps = (taps,)
    unknown = [t for t in taps if t not in available]
    if unknown:
        raise ValueError(f"unknown feature tap(s) {unknown} for {owner}; available taps: {list(available)}")
    return set(taps)


class FedModel(nn.Module):
    """Base class of every fedray model (see the module docstring for the contract).

    Subclasses create their submodules in ``__init__`` and then call :meth:`_finish` with the segment
    list, the split points, the default split and the dotted path of the classifier.

    Attributes:
        feature_taps:  names of the feature taps in forward order; always contains ``"embedding"``.
        split_points:  names of the cut points accepted by :meth:`split` (each is a tap name; the cut
                       lies right after that tap's post-activation, i.e. where the next layer reads).
        default_split: the split point used when ``split()`` gets none (``None`` if there is none).
        embedding_dim: size D of the ``"embedding"`` tap (B, D).
        model_name / model_options: set by :func:`fedray.models.build_model`.
    """

    feature_taps: tuple[str, ...] = ()
    split_points: tuple[str, ...] = ()
    default_split: str | None = None
    embedding_dim: int = 0

    def _finish(self, segments: Sequence[Segment], *, split_points: Sequence[str], default_split: str | None,
                classifier: str, embedding_dim: int) -> None:
        segments = tuple(segments)
        names = [s.name for s in segments]
        if len(set(names)) != len(names):
            raise ValueError(f"{type(self).__name__}: duplicate segment names {names}")
        taps = tuple(t for s in segments for t in s.taps)
        if len(set(taps)) != len(taps):
            raise ValueError(f"{type(self).__name__}: duplicate tap names {taps}")
        if "embedding" not in taps:
            raise ValueError(f"{type(self).__name__}: no segment is tapped 'embedding'")
        tap_to_index = {t: i for i, s in enumerate(segments) for t in s.taps}
        cuts: dict[str, int] = {}
        for p in split_points:
            if p not in tap_to_index:
                raise ValueError(f"{type(self).__name__}: split point {p!r} is not a tap name {taps}")
            cuts[p] = tap_to_index[p] + 1
        if default_split is not None and default_split not in cuts:
            raise ValueError(f"{type(self).__name__}: default split {default_split!r} not in {tuple(cuts)}")
        self.get_submodule(classifier)  # raises if the path is wrong
        # plain (non-Module) attributes: not registered as children, so state_dict keys stay the model's own
        self._segments = segments
        self._cuts = cuts
        self._embed_stop = tap_to_index["embedding"] + 1
        self._classifier_path = classifier
        self.feature_taps = taps
        self.split_points = tuple(cuts)
        self.default_split = default_split
        self.embedding_dim = int(embedding_dim)

    # ----------------------------------------------------------------------------------- forward passes
    def forward(self, x: Tensor) -> Tensor:
        """Logits (B, num_classes)."""
        return _run_segments(self, self._segments, x, None, None)

    def forward_features(self, x: Tensor, taps: Sequence[str] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Logits and a dict of tapped features (un-pooled: 4-D maps stay (B, C, H, W)).

        ``taps=None`` returns every tap in :attr:`feature_taps`; an unknown name raises ``ValueError``.
        The logits are bit-identical to :meth:`forward`. Use :func:`pool_tap` to turn a map into (B, C).
        """
        want = _check_taps(self.feature_taps, taps, f"model {getattr(self, 'model_name', type(self).__name__)!r}")
        feats: dict[str, Tensor] = {}
        logits = _run_segments(self, self._segments, x, want, feats)
        return logits, feats

    def embed(self, x: Tensor) -> Tensor:
        """The ``"embedding"`` tap (B, embedding_dim): the vector the classifier head reads."""
        feats: dict[str, Tensor] = {}
        _run_segments(self, self._segments[: self._embed_stop], x, {"embedding"}, feats)
        return feats["embedding"]

    def classifier_head(self) -> nn.Module:
        """The final classifier g (FedCCL's f/g split): ``classifier_head()(embed(x)) == forward(x)``."""
        return self.get_submodule(self._classifier_path)

    # ----------------------------------------------------------------------------------------- split
    def split(self, point: str | None = None) -> tuple[SplitPart, SplitPart]:
        """Cut the model at ``point`` (default :attr:`default_split`) into ``(client, server)`` parts.

        The parameters of the parts are the model's own tensors (disjoint between the parts, together all
        of the model's parameters); ``server(client(x))`` equals ``forward(x)`` exactly. The client part's
        output is the tap named ``point`` after its post-activation (for pre-ReLU taps: ``relu(tap)``),
        which is also what the server part expects, e.g. FedMLB feeds ``relu(tap)`` of a local model to the
        global model's server part.
        """
        name = getattr(self, "model_name", type(self).__name__)
        if point is None:
            point = self.default_split
            if point is None:
                raise ValueError(f"model {name!r} has no split points (options {getattr(self, 'model_options', {})})")
        if point not in self._cuts:
            raise ValueError(f"unknown split point {point!r} for model {name!r}; split points: {list(self.split_points)}")
        k = self._cuts[point]
        client_segs, server_segs = self._segments[:k], self._segments[k:]
        client, server = SplitPart(self, client_segs, "client", point), SplitPart(self, server_segs, "server", point)
        shared = {id(p) for p in client.parameters()} & {id(p) for p in server.parameters()}
        if shared:  # a model-definition error: a module listed by segments on both sides of the cut
            raise ValueError(f"model {name!r}: {len(shared)} parameter tensors would be shared by both parts at {point!r}")
        return client, server

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The forward pass as an ordered tuple of :class:`Segment` (read-only)."""
        return self._segments

    @staticmethod
    def wrap(features: nn.Module, classifier: nn.Module, *, embedding_dim: int | None = None) -> "WrappedModel":
        """A FedModel from two plain modules: ``forward(x) = classifier(features(x))``, with the output of
        ``features`` tapped ``"embedding"`` (a (B, D) vector, or a map that feature losses pool) and a split point
        there (client part: ``features``; server part: ``classifier``). Every algorithm that needs feature taps
        or a split point (``Algorithm.model_needs``) then takes a model built from the user's own modules.
        ``embedding_dim``: D, by default ``classifier.in_features``."""
        return WrappedModel(features, classifier, embedding_dim=embedding_dim)


def _wrapped_features(ns: Any, x: Tensor) -> Tensor:
    return ns.features(x)


def _wrapped_classifier(ns: Any, x: Tensor) -> Tensor:
    return ns.classifier(x)


class WrappedModel(FedModel):
    """:meth:`FedModel.wrap`: two plain modules as a FedModel with the tap and split point ``embedding``."""

    def __init__(self, features: nn.Module, classifier: nn.Module, *, embedding_dim: int | None = None):
        super().__init__()
        if not isinstance(features, nn.Module) or not isinstance(classifier, nn.Module):
            raise TypeError(f"FedModel.wrap needs two torch.nn.Module objects, got {type(features).__name__} and "
                            f"{type(classifier).__name__}")
        dim = embedding_dim if embedding_dim is not None else getattr(classifier, "in_features", None)
        if dim is None:
            raise ValueError(f"FedModel.wrap: give embedding_dim (the size of features(x)); the classifier "
                             f"{type(classifier).__name__} has no in_features")
        self.features, self.classifier = features, classifier
        self._finish([Segment("features", ("features",), _wrapped_features, ("embedding",)),
                      Segment("classifier", ("classifier",), _wrapped_classifier)],
                     split_points=("embedding",), default_split="embedding", classifier="classifier",
                     embedding_dim=int(dim))


# ----------------------------------------------------------------------------------------- projection head
def _project(ns: Any, x: Tensor) -> Tensor:
    return ns.proj_l2(F.relu(ns.proj_l1(pool_tap(x))))


def _proj_classify(ns: Any, x: Tensor) -> Tensor:
    return ns.proj_fc(x)


class ProjectedModel(FedModel):
    """A :class:`FedModel` with MOON's projection head (Li et al. 2021, the official ``ModelFedCon``):
    the base model's layers up to its ``embedding`` h, then ``z = l2(ReLU(l1(h)))`` (``l1``: D -> D,
    ``l2``: D -> ``proj_dim``) and a new linear classifier on z. The base classifier is dropped.

    Taps: the base's taps up to its embedding, with that one renamed ``pooled``, and ``embedding`` = z (the
    vector the classifier reads, so contrastive losses on ``embedding`` use the projection). The trunk's
    submodules are the base model's own objects under the same names, and the head's parameters
    (``proj_l1``, ``proj_l2``, ``proj_fc``) are ordinary parameters: all of them are in the flat weight vector
    that is broadcast and averaged. Split points: the base's, before its embedding."""

    def __init__(self, base: FedModel, proj_dim: int = 256):
        super().__init__()
        if not isinstance(base, FedModel):
            raise TypeError(f"a projection head needs a FedModel, got {type(base).__name__}")
        proj_dim = int(proj_dim)
        if proj_dim < 1:
            raise ValueError(f"projection dimension must be >= 1, got {proj_dim}")
        stop = base._embed_stop
        trunk = [Segment(s.name, s.modules, s.fn, tuple("pooled" if t == "embedding" else t for t in s.taps), s.post)
                 for s in base.segments[:stop]]
        _attach(self, base, trunk)
        d = int(base.embedding_dim)
        num_classes = int(getattr(base, "num_classes", 0) or base.classifier_head().out_features)
        self.proj_l1 = nn.Linear(d, d)
        self.proj_l2 = nn.Linear(d, proj_dim)
        self.proj_fc = nn.Linear(proj_dim, num_classes)
        segments = [*trunk, Segment("projection", ("proj_l1", "proj_l2"), _project, ("embedding",)),
                    Segment("proj_classifier", ("proj_fc",), _proj_classify)]
        trunk_taps = {t for s in trunk for t in s.taps}
        points = [p for p in base.split_points if p in trunk_taps and p != "pooled"]
        self._finish(segments, split_points=points, default_split=None, classifier="proj_fc", embedding_dim=proj_dim)
        self.model_name = getattr(base, "model_name", type(base).__name__)
        self.model_options = {**getattr(base, "model_options", {}), "projection_dim": proj_dim}
        self.num_classes = num_classes
