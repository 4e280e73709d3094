"""The event contract, defined once: the envelope, every kind's payload model, the registry of kinds.

Everything else derives from this file: the Parquet columns (`runledger.ledger.contract.columns`, `runledger.ledger.storage.store`), the
JSON Schema that `runledger schema` prints (`json_schema`), the validators (`runledger.ledger.contract.validation`),
the SQL views that name each kind's rows and the NATS roles that may publish it (`REGISTRY`). See
DESIGN.md, "The contract". How an event is written and checked is elsewhere: canonical JSON and the
hash in `runledger.ledger.contract.canonical`, sealing in `runledger.ledger.emit.sealing`, checking in `runledger.ledger.contract.validation`.

An event is a fact in the past: a frozen payload model (`StepCompleted`, `DecisionMade`, ...) inside
the envelope (who, when, where in its producer's chain, and the hash that links it to the one before).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NamedTuple, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1
STREAM = "RUNLEDGER"
SUBJECT_PREFIX = "runledger"
MAX_EVENT_BYTES = 1 << 20  # one event's JSON text; larger input is quarantined, never truncated
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # run_id and producer: subject token, dir name
# [0-9], not \d: \d also matches non-ASCII digits (e.g. "٢٠٢٦"), which no timestamp parser reads
TIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$")
TIME_YEARS = (1970, 2261)  # stored as a timestamp via nanoseconds (int64 ns: 1677..2262)
HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class InvalidEvent(ValueError):
    """Input that is not a valid event; the message is the one-line reason."""


def make_event_id(run_id: str, producer: str, attempt: int, seq: int) -> str:
    return f"{run_id}:{producer}:{attempt}:{seq}"


def subject_for(run_id: str, kind: str) -> str:
    return f"{SUBJECT_PREFIX}.{run_id}.{kind}"


RELAY = "relay"  # a relayed event's subject ends `.relay.{relay user}.{source}` (`runledger push`: relay_subject_for)


def relay_subject_for(run_id: str, kind: str, relay: str, source: str) -> str:
    """The subject of an event `relay` carries for its producer from root `source` (its id: `runledger
    push`): the run's subject with `.relay.{relay}.{source}` after it, so that on a secure server the
    subject names who relayed it (the `relay` role may publish only `*.*.relay.{its name}.*`; no worker
    may), the relay says where from, and the run stays the subject's second token."""
    return f"{subject_for(run_id, kind)}.{RELAY}.{relay}.{source}"


# --------------------------------------------------------------------------------------------
# Payloads: one frozen model per kind, and the models nested in them
# --------------------------------------------------------------------------------------------

Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
INT64_MAX = 2**63 - 1  # integers are stored in int64 Parquet columns
NonNeg = Annotated[int, Field(ge=0, le=INT64_MAX)]
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Json = dict[str, Any]
Dispatch = Literal["capacity", "dropless"]

# Free-form metrics (`runledger.log`): any names, up to MAX_METRIC_NAME characters, at most MAX_METRICS
# per event (2,048 names of 256 characters fit MAX_EVENT_BYTES).
MAX_METRIC_NAME = 256
MAX_METRICS = 2048
MetricName = Annotated[str, Field(min_length=1, max_length=MAX_METRIC_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")]
NonFinite = Literal["nan", "inf", "-inf"]
# A run's display name and its W&B-style labels (group, job_type): any text on one line; never unique
MAX_LABEL = 256
Label = Annotated[str, Field(min_length=1, max_length=MAX_LABEL, pattern=r"^[^\x00-\x1f\x7f]+$")]


class StoredAsMap:
    """Marks a dict field stored as a Parquet MAP column rather than JSON text (`runledger.ledger.contract.columns`)."""


class StoredWide:
    """Marks a dict of numbers stored as one DOUBLE column per name, `{field}/{name}` (`runledger.ledger.contract.columns`):
    a query of one metric reads one column, as in a columnar time-series store. A name a row lacks, or
    whose value was not finite, is null there."""


Metrics = Annotated[dict[MetricName, Finite | None], Field(max_length=MAX_METRICS), StoredWide()]
NonFiniteNames = Annotated[dict[MetricName, NonFinite], Field(max_length=MAX_METRICS), StoredAsMap()]


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ContextExtension(Payload):
    """A longer sequence length scheduled at a step (probed ahead; an agent may hold it)."""

    at_step: NonNeg
    seq_len: NonNeg
    done: bool = False
    at: NonNeg | None = Field(None, description="the step it was made at")


class Schedule(Payload):
    """The learning-rate schedule in force (training/schedule.py: a pure function of the step). A
    producer that knows only part of it (an importer, a horizon decision) leaves the rest out."""

    peak_lr: Finite | None = None
    warmup_steps: NonNeg | None = None
    horizon_steps: NonNeg | None = None
    min_lr_ratio: Finite | None = None
    anchor_step: NonNeg | None = Field(None, description="after a retime: the decay runs from anchor_lr here")
    anchor_lr: Finite | None = None
    tokens_per_step: NonNeg | None = None
    horizon_tokens: NonNeg | None = None
    context_extension: ContextExtension | None = None


class ResumedFrom(Payload):
    """The run's own checkpoint an attempt resumed from."""

    path: str
    step: NonNeg
    content_hash: str


class ForkedFrom(Payload):
    """Where in a parent run's history a fork (or a rewind: the run's own history) starts: the run, the step,
    the attempt and the ledger position of the parent's last step at or before it, and the parent's
    checkpoint there when one was saved (the trainer's fork restores it; a user's loop may have none).
    `runledger train --fork-from RUN@STEP` and `runledger.init(fork_from="RUN?_step=N")` fill it alike
    (`runledger.queries.forks.fork_point`)."""

    run_id: str
    step: NonNeg
    content_hash: str | None = Field(None, description="the checkpoint's (null: the parent saved none at or before step)")
    path: str | None = None
    attempt: NonNeg | None = Field(None, description="the parent's attempt whose step it is (null in forks recorded "
                                                      "before attempts were kept)")
    stream_seq: NonNeg | None = Field(None, description="the ledger position: the stream_seq of the parent's step "
                                                         "event (`runledger replay RUN --as-of-seq` rebuilds it there)")
    event_id: str | None = Field(None, description="the parent's step event at the fork (the history's last row)")
    hash: str | None = Field(None, description="that event's hash, so the fork names the parent's chain exactly")


class LadderRung(Payload):
    """The scaling ladder a run is a rung of: the runs of one ladder `name` are each other's peers."""

    name: str
    rung: NonNeg | None = None
    target: str | None = None
    preset: str | None = None
    tokens_per_active_param: Finite | None = Field(None, description="the tokens per active parameter this rung "
                                                   "is planned to train (its own, after any step scaling)")
    target_tokens_per_active_param: Finite | None = Field(None, description="the ladder's ratio: the target's")


class RunStarted(Payload):
    """A worker started (or resumed, or forked) a run: everything needed to audit it later."""

    config: Json = Field(description="the trainer's config (runledger.training.config.TrainConfig.to_dict(): the audits "
                                     "read moe.n_experts and planned_mfu)")
    config_hash: str
    code_commit: str | None = None
    preset: str | None = None
    project: str | None = None
    name: Label | None = Field(None, description="the run's display name (`runledger.init(name=)`), not unique: the id "
                                                 "is run_id; null in runs started before names were kept (read as run_id)")
    group: Label | None = Field(None, description="W&B's group: runs of one experiment")
    job_type: Label | None = Field(None, description="W&B's job_type: train, eval, ...")
    notes: str | None = Field(None, description="free text about the run")
    tags: list[str] = Field(default_factory=list)
    token_budget: NonNeg | None = Field(None, description="null: not planned (a user's own loop, `runledger.init`)")
    tokens_per_step: NonNeg | None = None
    schedule: Schedule | None = None
    data_mixture: dict[str, Finite] = Field(default_factory=dict)
    planned_tokens_per_s: Finite | None = None
    deadline_s: Finite | None = None
    hardware: Json = Field(default_factory=dict)
    heartbeat_s: Positive | None = Field(None, description="the interval of the run's `heartbeat` events; null: it sends none")
    peak_flops: Finite | None = None
    flops_per_token: Finite | None = None
    thresholds: dict[str, Finite] = Field(default_factory=dict, description="overrides of the anchors")
    resumed_from: ResumedFrom | None = None
    parent: ForkedFrom | None = Field(None, description="a fork: the parent run's history it goes on from (its "
                                                        "steps read the parent's up to parent.step)")
    rewind: ForkedFrom | None = Field(None, description="a rewind (`init(resume_from=\"RUN?_step=N\")`): the run's own "
                                                        "history this attempt goes on from; the earlier attempts' steps "
                                                        "after rewind.step no longer count")
    ladder: LadderRung | None = None


class StepCompleted(Payload):
    """One optimizer step."""

    loss: Finite | None
    grad_norm: Finite | None
    lr: Finite
    tokens: NonNeg
    step_time_s: Finite
    param_norm: Finite | None = None
    z_loss: Finite | None = None
    lb_loss: Finite | None = None
    router_entropy: Finite | None = None
    mfu: Finite | None = None
    tokens_per_s: Finite | None = None
    seq_len: NonNeg | None = None
    flops_per_token: Finite | None = Field(None, description="training FLOPs per token at this step's seq_len (mfu's numerator)")
    router_bias_min: Finite | None = Field(None, description="the smallest router (load-balancing) bias of any layer")
    router_bias_max: Finite | None = Field(None, description="the largest router (load-balancing) bias of any layer")
    skipped: bool = False


class LayerDrops(Payload):
    layer: NonNeg
    assignments: NonNeg
    sender_dropped: NonNeg
    receiver_dropped: NonNeg
    drop_fraction: Finite
    expert_loads: list[NonNeg] = Field(default_factory=list)


class TokensDropped(Payload):
    """Token assignments the capacity-limited transport dropped in one step, per layer."""

    dispatch: Literal["capacity", "dropless"]
    assignments: NonNeg
    dropped: NonNeg
    drop_fraction: Finite
    layers: list[LayerDrops] = Field(default_factory=list)
    cf_send: Finite | None = None
    cf_recv: Finite | None = None
    seq_len: NonNeg | None = None
    probe: bool = Field(False, description="measured at a longer length than trained (before a context extension)")


class EvalCompleted(Payload):
    """Held-out loss, overall and per domain."""

    loss: Finite
    domain_losses: dict[str, Finite] = Field(default_factory=dict)
    tokens: NonNeg = 0
    split: str = "heldout"


class CheckpointSaved(Payload):
    path: str
    bytes: NonNeg
    seconds: Finite | None = Field(None, description="how long the save took; null where the saver did not time it "
                                                   "(a framework's checkpoint recorded after it was written)")
    content_hash: str
    config_hash: str | None = None
    tokens_seen: NonNeg | None = None
    reason: Literal["periodic", "requested", "final", "rollback"] = "periodic"


class CheckpointAttested(Payload):
    """A saved checkpoint attested (`runledger.ledger.attest`): its folder signed with OpenSSF model signing
    (a local EC key; the signature, `model.sig`, in the folder) and described by an in-toto Statement with a
    SLSA Provenance v1 predicate (`provenance.intoto.json`, canonical JSON, in the folder). This event fixes
    the statement's digest in the ledger, so a statement swapped afterwards no longer matches it."""

    path: str = Field(description="the checkpoint folder on the producer's machine")
    subject_sha256: Annotated[str, Field(pattern=HASH_RE.pattern)] = Field(
        description="the folder's digest as model signing signed it (the statement's subject)")
    statement_sha256: Annotated[str, Field(pattern=HASH_RE.pattern)] = Field(
        description="SHA-256 of the statement's canonical JSON")
    key_id: Annotated[str, Field(pattern=HASH_RE.pattern)] = Field(
        description="SHA-256 of the signing key's public key (DER SubjectPublicKeyInfo)")
    content_hash: str | None = Field(None, description="the checkpoint's content hash (its `checkpoint` event's)")
    tlog_size: NonNeg | None = Field(None, description="the size of the log checkpoint the statement names "
                                                       "(null: none was available)")
    seconds: Finite | None = Field(None, description="how long hashing, signing and writing took")


class DataSource(Payload):
    domain: str
    path: str
    sha256: str
    byte_start: NonNeg
    byte_end: NonNeg


class DataRecorded(Payload):
    """Where the tokens came from: sources with hashes, byte ranges, tokens per domain."""

    sources: list[DataSource] = Field(default_factory=list)
    tokens_per_domain: dict[str, NonNeg] = Field(default_factory=dict)
    mixture: dict[str, Finite] = Field(default_factory=dict)
    seed: Int64 | None = None


class ForecastMade(Payload):
    """The ladder's projected loss for the target run at one fraction of training: of the plan as
    registered (revision 0, no decision), or of a plan an applied decision changed (a revision, which
    names that decision and the step from which its plan is in force)."""

    target_run: str
    fraction: Finite
    target_tokens: NonNeg | None = None
    target_flops: Finite | None = None
    projected_loss: Finite
    band_low: Finite
    band_high: Finite
    band_level: Finite | None = Field(None, description="the band's nominal coverage (0.95: a 95% band); null: "
                                      "nothing sizes it (flags say why)")
    fit: dict[str, Finite] = Field(default_factory=dict, description="E, A, alpha")
    rungs: list[str] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    self_check_error: Finite | None = None
    method: Literal["joint", "per_fraction"] | None = Field(
        None, description="joint: every fraction fitted at once (one E); per_fraction: a law per fraction")
    e_fixed: Finite | None = Field(None, description="the irreducible loss the fit was given (null: fitted)")
    revision: NonNeg = Field(0, description="0: the plan as registered; n: the n-th plan change re-forecast")
    decision_id: str | None = Field(None, description="the applied decision whose new plan this revision forecasts")
    horizon_tokens: NonNeg | None = Field(None, description="the horizon of the plan the fractions are of")
    from_step: NonNeg | None = Field(None, description="the first update the plan governs (after its decision)")
    from_tokens: NonNeg | None = Field(None, description="tokens seen before from_step")
    supported: bool = Field(True, description="false: the ladder cannot speak for this plan (flags say why)")


class AlertRaised(Payload):
    alert_id: str
    agent: str
    rule: str
    severity: Literal["info", "warn", "fail"] = "warn"
    state: Literal["open", "resolved"] = "open"
    message: str
    evidence: Json = Field(default_factory=dict)


class AlertAcknowledged(Payload):
    """A person took a page: alert `alert_id` of the run is acknowledged, by whom and how (the envelope's
    time says when). Only a person's producer (`cli`, `ui`) or notify's ack listener (`notify`) may give
    one (runledger.ledger.contract.roles.may_acknowledge); notify stops repeating the page once it reads it."""

    alert_id: Annotated[str, Field(min_length=1, max_length=256)]
    by: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")]
    via: Literal["webhook", "dashboard", "cli"]
    note: str | None = None


# Decisions: what each action takes (`params`) and what it changes (`decision_applied.before/after`).


class NewHorizon(Payload):
    horizon_steps: NonNeg | None = None
    horizon_tokens: NonNeg | None = None


class CapacityFactors(Payload):
    cf_send: Finite | None = None
    cf_recv: Finite | None = None
    cf: Finite | None = Field(None, description="both factors")


class DispatchParams(Payload):
    dispatch: Dispatch


class DispatchState(Payload):
    dispatch: Dispatch | None = None
    cf_send: Finite | None = None
    cf_recv: Finite | None = None


class ExtensionLength(Payload):
    seq_len: NonNeg | None = None


class ExtensionHeld(Payload):
    held: bool


class ZLossWeight(Payload):
    weight: Finite | None = Field(None, description="the logit z-loss weight; null turns it off")


class ZLossState(Payload):
    logit_z_coef: Finite | None = None


class CheckpointAsked(Payload):
    checkpoint_step: NonNeg | None = None


class RollbackTarget(Payload):
    to_step: NonNeg | None = Field(None, description="the checkpoint at or before this step (default: the last)")


class RollbackPoint(Payload):
    step: NonNeg
    checkpoint: str | None = None
    content_hash: str | None = None


class Review(Payload):
    decision_id: str = Field(description="the proposed decision approved or rejected")


class Nothing(Payload):
    pass


class ActionTypes(NamedTuple):
    params: type[Payload]  # decision.params
    changes: type[Payload]  # decision_applied.before and .after


ACTIONS: dict[str, ActionTypes] = {
    "set_token_horizon": ActionTypes(NewHorizon, Schedule),
    "set_capacity_factor": ActionTypes(CapacityFactors, DispatchState),
    "set_dispatch": ActionTypes(DispatchParams, DispatchState),
    "hold_context_extension": ActionTypes(ExtensionLength, ExtensionHeld),
    "release_context_extension": ActionTypes(ExtensionLength, ExtensionHeld),
    "set_z_loss_weight": ActionTypes(ZLossWeight, ZLossState),
    "checkpoint_now": ActionTypes(Nothing, CheckpointAsked),
    "rollback": ActionTypes(RollbackTarget, RollbackPoint),
    "approve": ActionTypes(Review, Nothing),
    "reject": ActionTypes(Review, Nothing),
}
ActionName = Literal[tuple(ACTIONS)]  # type: ignore[valid-type]


def _fits_action(part: str, *fields: str, absent: dict | None = None) -> Any:
    """A model validator (mode "before", so that it sees the dict as given): each of `fields` is
    valid for ACTIONS[action].<part> (one left out is `absent`, or not checked if None).
    runledger.ledger.contract.validation carries it over to the TypedDict validators."""

    def check(cls, data: Any) -> Any:
        action = data.get("action") if isinstance(data, dict) else None
        if type(action) is str and action in ACTIONS:
            for name in fields:
                if name in data or absent is not None:
                    try:
                        getattr(ACTIONS[action], part).model_validate(data.get(name, absent))
                    except ValidationError as err:
                        e = err.errors()[0]
                        where = ".".join(map(str, (name, *e["loc"])))
                        raise ValueError(f"{where}: {e['msg']} (for action {action})") from None
        return data

    return model_validator(mode="before")(classmethod(check))


class DecisionMade(Payload):
    """A contingency decision (an agent's or a person's) with the evidence that caused it."""

    decision_id: str
    agent: str
    rule: str
    action: ActionName
    params: Union[tuple(dict.fromkeys(a.params for a in ACTIONS.values()))] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="ACTIONS[action].params")
    rationale: str
    evidence: Json = Field(default_factory=dict, description="query, rows, ledger position seen")
    mode: Literal["auto", "proposed"] = "auto"

    _params_fit_action = _fits_action("params", "params", absent={})


AnyChanges = Union[tuple(dict.fromkeys(a.changes for a in ACTIONS.values()))]  # type: ignore[valid-type]


class DecisionApplied(Payload):
    """The worker carried out (or refused) a decision at a step boundary: emitted between updates
    k-1 and k with step k-1, so it governs from update step + 1."""

    decision_id: str
    action: ActionName
    status: Literal["applied", "refused"] = "applied"
    before: AnyChanges = Field(default_factory=dict, description="ACTIONS[action].changes")
    after: AnyChanges = Field(default_factory=dict, description="ACTIONS[action].changes")
    reason: str | None = None

    _changes_fit_action = _fits_action("changes", "before", "after")  # (a refused decision has neither)


class RunFinished(Payload):
    status: Literal["completed", "failed", "stopped"]
    final_step: NonNeg | None = None
    tokens_seen: NonNeg | None = None
    final_loss: Finite | None = None
    reason: str | None = None
    summary: dict[MetricName, Finite | str | bool | None] = Field(
        default_factory=dict, description="`run.summary`: by default each metric's last value (null if not finite)")


def _nonfinite_named(cls, data: Any) -> Any:
    """A model validator (before): a metric is null exactly when `nonfinite` names it (JSON has no NaN)."""
    if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
        nonfinite = data.get("nonfinite", {})
        if not nonfinite and None not in data["metrics"].values():
            return data  # (the common case, at C speed)
        if isinstance(nonfinite, dict):
            for name, value in data["metrics"].items():
                if (value is None) != (name in nonfinite):
                    raise ValueError(f"metrics.{name}: null exactly when nonfinite names it (its kind: nan, inf, -inf)"
                                     if value is None else f"nonfinite.{name}: names a metric that is not null")
            for name in nonfinite:
                if name not in data["metrics"]:
                    raise ValueError(f"nonfinite.{name}: names no metric")
    return data


class MetricsLogged(Payload):
    """Any named numbers a loop logged at a step (`runledger.log`). JSON cannot carry NaN or infinity:
    a value that is not finite is null in `metrics` and named in `nonfinite` with its kind, so it is
    recorded, never dropped. A string logged under a name, or None (W&B's log takes both), is in
    `text` (None as null), not in `metrics`."""

    metrics: Metrics
    nonfinite: NonFiniteNames = Field(default_factory=dict)
    text: Annotated[dict[MetricName, str | None], Field(max_length=MAX_METRICS), StoredAsMap()] = Field(
        default_factory=dict, description="the names logged with a string, or None (null), at this step")

    _named = model_validator(mode="before")(classmethod(_nonfinite_named))


class SystemSampled(MetricsLogged):
    """The machine a run is on, sampled every few seconds (`runledger.init(system_metrics=)`): CPU, memory,
    disk and network (psutil), each GPU (NVML) and each JAX device's memory, named and kept as in
    MetricsLogged."""

    interval_s: Finite | None = None


class ArtifactSaved(Payload):
    """A file the run saved (`runledger.save`, `log_artifact`): where it was and its SHA-256 when recorded
    (the file itself stays where it is: the ledger keeps its identity, not its bytes)."""

    path: str = Field(description="the file's absolute path on the producer's machine")
    sha256: Annotated[str, Field(pattern=HASH_RE.pattern)]
    bytes: NonNeg
    name: str | None = Field(None, description="the artifact's name (log_artifact), else null")
    type: str | None = Field(None, description="the artifact's type (e.g. model, dataset), else null")
    via: Literal["save", "log_artifact"]


# Values `runledger.log` records beside numbers (`runledger.values`): each its own event at the step it was
# logged at, under the name it was logged as (`key`).
MAX_BUCKETS = 10_000  # a histogram's buckets (Levanter's default is 64; a MoE router's, a few hundred); ~250 KB
MAX_TABLE_COLUMNS = 256
MAX_TABLE_ROWS = 10_000  # and MAX_TABLE_BYTES of JSON text, whichever comes first (`runledger.values`)
MAX_TABLE_BYTES = 512 << 10  # half of MAX_EVENT_BYTES: the rest is the envelope's and the columns'
MEDIA_DIR = "media"  # {root}/media/{sha256}: the blobs media events name (`runledger.ledger.storage.media`)
MEDIA_TYPE_RE = re.compile(r"^[a-z]+/[a-z0-9][a-z0-9.+-]{0,126}$")
NonNegFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Cell = Union[bool, Int64, Finite, str, None]


def _buckets_match(cls, data: Any) -> Any:
    """A model validator (before): a histogram's edges rise (never fall) and are one more than its counts."""
    if isinstance(data, dict) and isinstance(data.get("edges"), list) and isinstance(data.get("counts"), list):
        edges = data["edges"]
        if len(edges) != len(data["counts"]) + 1:
            raise ValueError(f"edges: {len(edges)} edges for {len(data['counts'])} counts (one more than the counts)")
        try:
            rising = edges == sorted(edges)  # (C speed: a histogram of 10,000 buckets is checked per step)
        except TypeError:
            rising = True  # not all numbers: the field's own check refuses them
        if not rising:
            raise ValueError("edges: they must not fall")
    return data


def _rows_fit_columns(cls, data: Any) -> Any:
    """A model validator (before): every row of a table has one cell per column, and rows_logged counts them all."""
    if isinstance(data, dict) and isinstance(data.get("rows"), list) and isinstance(data.get("columns"), list):
        width = len(data["columns"])
        for i, row in enumerate(data["rows"]):
            if isinstance(row, list) and len(row) != width:
                raise ValueError(f"rows.{i}: {len(row)} cells for {width} columns")
        logged = data.get("rows_logged")
        if isinstance(logged, int) and logged < len(data["rows"]):
            raise ValueError(f"rows_logged: {logged} is fewer than the {len(data['rows'])} rows kept")
    return data


class HistogramLogged(Payload):
    """A histogram logged under a name (`runledger.Histogram`, a list or array given to `log`, Levanter's
    SummaryStats), bucket by bucket, as given: bucket i counts the values in [edges[i], edges[i+1]) (the
    last bucket closed), with the count, min, max, sum and sum of squares of the values where known (null:
    made from counts alone, `np_histogram=`). Values that were not finite are left out of the buckets and
    counted in `nonfinite`."""

    key: MetricName
    edges: Annotated[list[Finite], Field(min_length=2, max_length=MAX_BUCKETS + 1)]
    counts: Annotated[list[NonNegFinite], Field(min_length=1, max_length=MAX_BUCKETS)]
    count: NonNegFinite = Field(description="the values counted (Levanter's `num`)")
    min: Finite | None = None
    max: Finite | None = None
    sum: Finite | None = None
    sum_squares: Finite | None = None
    nonfinite: NonNeg = Field(0, description="values left out of the buckets: nan, inf or -inf")

    _buckets = model_validator(mode="before")(classmethod(_buckets_match))


class TableLogged(Payload):
    """A table logged under a name (`runledger.Table(columns=, data=)`): its rows of text, numbers, booleans
    and nulls as given, up to MAX_TABLE_ROWS rows and MAX_TABLE_BYTES of text; a larger one is cut to that
    (the first rows kept), and `rows_logged` says how many rows it had."""

    key: MetricName
    columns: Annotated[list[Annotated[str, Field(max_length=MAX_METRIC_NAME)]], Field(max_length=MAX_TABLE_COLUMNS)]
    rows: Annotated[list[list[Cell]], Field(max_length=MAX_TABLE_ROWS)]
    rows_logged: NonNeg = Field(description="the rows the table had: more than len(rows) when it was cut")

    _fit = model_validator(mode="before")(classmethod(_rows_fit_columns))


class MediaLogged(Payload):
    """A file logged under a name (`runledger.Image`, `runledger.File`): its bytes are stored once, by
    their SHA-256, at {root}/media/{sha256} (written before the event is sent); the event carries the
    digest, the size and the media type. `runledger verify` checks each named blob's digest."""

    key: MetricName
    sha256: Annotated[str, Field(pattern=HASH_RE.pattern)]
    bytes: NonNeg
    type: Annotated[str, Field(pattern=MEDIA_TYPE_RE.pattern)] = Field(description="the media type: image/png, ...")
    name: str | None = Field(None, description="the file's name where it came from a file, else null")
    caption: str | None = None
    width: NonNeg | None = None
    height: NonNeg | None = None


# The script's console (`runledger.console`): its lines, rate-bounded, in events of at most MAX_CONSOLE_LINES lines
MAX_CONSOLE_LINE = 4096  # characters of one line: a longer one is cut to it (and counted)
MAX_CONSOLE_LINES = 1000


class ConsoleLogged(Payload):
    """Lines the run's script wrote to its stdout or stderr (`runledger.init(console=True)`, the default), in order.
    `first` is the number of the first of them in its stream (from 0, per attempt), counting the lines left out
    before them: past the rate bound lines are left out and counted in `dropped`; a line longer than
    MAX_CONSOLE_LINE is cut to it, counted in `cut`."""

    stream: Literal["stdout", "stderr"]
    first: NonNeg
    lines: Annotated[list[Annotated[str, Field(max_length=MAX_CONSOLE_LINE)]], Field(max_length=MAX_CONSOLE_LINES)]
    dropped: NonNeg = Field(0, description="lines left out just before these (the rate bound)")
    cut: NonNeg = Field(0, description="lines of these cut to MAX_CONSOLE_LINE characters")


# A run's state (the `state` column of the `runs` view, queries/views.sql), named here once:
RUN_STATES = ("running", "finished", "failed", "crashed")  # finished: completed; failed: failed or stopped
HEARTBEAT_MISSED = 2.5  # crashed: no run_finished, and the last heartbeat older than this many of its intervals


class Heartbeat(Payload):
    """A process of a run is alive (`runledger.init`'s run, the trainer's worker): sent every `interval_s`
    while it lives. A run with no `run_finished` whose last heartbeat is older than HEARTBEAT_MISSED of
    its intervals is `crashed` (RUN_STATES), not `running`."""

    host: str
    pid: NonNeg
    interval_s: Positive


class ConfigUpdated(Payload):
    """Config keys set after the run started (`run.config[k] = v`): the keys and their new values."""

    config: Json


class ChainHeadSigned(Payload):
    """A producer's signature over its chain so far (runledger.ledger.tlog.chainheads): `note` is a C2SP signed
    note whose text is `runledger/chain-head/v1`, then the run, producer, attempt, `upto_seq` and the
    base64 of `head` (the hash of the event at upto_seq: the one just before this event), one a line, signed by
    the attempt's own Ed25519 key. The chain's first head also carries that key (`attempt_key`, a verifier key)
    and `vouch`: a signed note by the user's key (`user_key`) whose text is `runledger/chain-key/v1`, the run,
    producer, attempt and the attempt key. A chain whose producer opened it again carries a new attempt key,
    vouched for by the same user key, in the first head after it."""

    upto_seq: NonNeg
    head: Annotated[str, Field(pattern=HASH_RE.pattern)]
    note: Annotated[str, Field(max_length=4096)]
    attempt_key: Annotated[str, Field(max_length=512)] | None = None
    user_key: Annotated[str, Field(max_length=512)] | None = None
    vouch: Annotated[str, Field(max_length=4096)] | None = None


class CoveredChain(Payload):
    """One chain a tombstone covers: its events from seq 0 up to `seq`, whose hash is `hash`."""

    producer: Annotated[str, Field(pattern=NAME_RE.pattern)]
    attempt: NonNeg
    seq: NonNeg
    hash: Annotated[str, Field(pattern=HASH_RE.pattern)]


class RunDeleted(Payload):
    """A person deleted a run's events (`runledger delete`): the tombstone, stored under the run's id
    (producer `cli`) and kept when the run's other rows are taken out of the tables. It names exactly
    what went: each chain up to a seq and hash (the heads the ledger had recorded), and how many events
    that is; `verify` accepts that much missing and no more. `by`: who, as `authority` knows them (the
    OS user on the embedded default, the credential's user on a secure server)."""

    chains: list[CoveredChain] = Field(min_length=1)
    events: NonNeg = Field(description="the events the chains hold (seq 0 to seq of each)")
    by: Annotated[str, Field(min_length=1, max_length=256)]
    authority: Literal["os_user", "nats_user"]
    reason: str | None = None


# --------------------------------------------------------------------------------------------
# The registry of kinds
# --------------------------------------------------------------------------------------------


class Kind(NamedTuple):
    model: type[Payload]
    view: str  # the SQL view of all its rows as stored (queries/views.sql), which a one-run audit scopes to the run
    publishers: tuple[str, ...]  # the NATS roles that may publish it on a secure server (ledger/bus/natsserver.py)


REGISTRY: dict[str, Kind] = {
    "run_started": Kind(RunStarted, "runs", ("worker",)),
    "step": Kind(StepCompleted, "step_events", ("worker",)),  # steps_all adds `runledger.log` runs'
    "drops": Kind(TokensDropped, "drops_all", ("worker",)),
    "eval": Kind(EvalCompleted, "eval_events", ("worker",)),  # evals adds `runledger.log` runs'
    "checkpoint": Kind(CheckpointSaved, "checkpoints", ("worker",)),
    "data": Kind(DataRecorded, "data", ("worker",)),
    "attestation": Kind(CheckpointAttested, "attestations", ("worker",)),  # a checkpoint's signed provenance
    "forecast": Kind(ForecastMade, "forecasts", ()),  # the ladder's, on an open server
    "alert": Kind(AlertRaised, "alerts", ("agent", "worker")),  # a worker's on its own run (`runledger.alert`)
    "decision": Kind(DecisionMade, "decisions", ("agent",)),
    "alert_ack": Kind(AlertAcknowledged, "alert_acks", ("agent", "notify")),  # a person's (cli/ui) or notify's ack listener
    "decision_applied": Kind(DecisionApplied, "decisions_applied", ("worker",)),
    "run_finished": Kind(RunFinished, "runs_finished", ("worker",)),
    "metrics": Kind(MetricsLogged, "metric_events", ("worker",)),  # long form: metrics_all, metrics
    "system": Kind(SystemSampled, "system_events", ("worker",)),  # long form: system_metrics
    "config": Kind(ConfigUpdated, "config_updates", ("worker",)),
    "artifact": Kind(ArtifactSaved, "artifacts", ("worker",)),  # a worker's on its own run (`runledger.save`)
    "histogram": Kind(HistogramLogged, "histograms", ("worker",)),  # buckets one a row: histogram_buckets
    "table": Kind(TableLogged, "logged_tables", ("worker",)),  # rows one a row: table_rows
    "media": Kind(MediaLogged, "media", ("worker",)),  # the blob at {root}/media/{sha256}
    "console": Kind(ConsoleLogged, "console", ("worker",)),  # lines one a row: console_lines
    "heartbeat": Kind(Heartbeat, "heartbeats", ("worker",)),  # a worker's for its own run (liveness)
    "tombstone": Kind(RunDeleted, "tombstones", ("admin",)),  # `runledger delete`: see runledger.ledger.storage.removal
    "chain_head": Kind(ChainHeadSigned, "chain_heads", ("worker",)),  # a worker's own chain (its heads signed)
}
KINDS: dict[str, type[Payload]] = {kind: k.model for kind, k in REGISTRY.items()}
VIEWS: dict[str, str] = {kind: k.view for kind, k in REGISTRY.items()}


def kinds_of(role: str) -> tuple[str, ...]:
    """The kinds a NATS role may publish."""
    return tuple(kind for kind, k in REGISTRY.items() if role in k.publishers)


class Envelope(BaseModel):
    """One event: who, when, where in its producer's chain, and the kind-specific payload."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    event_id: str
    run_id: Annotated[str, Field(pattern=NAME_RE.pattern)]
    producer: Annotated[str, Field(pattern=NAME_RE.pattern)]
    attempt: NonNeg
    seq: NonNeg
    kind: Literal[tuple(KINDS)]  # type: ignore[valid-type]
    time: Annotated[str, Field(pattern=TIME_RE.pattern)]
    step: NonNeg | None
    schema_version: Literal[SCHEMA_VERSION]
    prev_hash: str
    hash: Annotated[str, Field(pattern=HASH_RE.pattern)]
    payload: Json


ENVELOPE_FIELDS = tuple(Envelope.model_fields)
STORE_COLUMNS = ("stream_seq", "ingested_at", "ts")  # beside the envelope's in every stored row


def _check_no_collisions() -> None:
    reserved = set(ENVELOPE_FIELDS) | set(STORE_COLUMNS)
    for kind, model in KINDS.items():
        clash = reserved & set(model.model_fields)
        assert not clash, f"payload of {kind} reuses envelope column names {clash}"


_check_no_collisions()


def json_schema() -> dict:
    """JSON Schema of the envelope and of every kind's payload (what `runledger schema` prints)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "envelope": Envelope.model_json_schema(),
        "kinds": {kind: model.model_json_schema() for kind, model in KINDS.items()},
        "actions": {action: {"params": spec.params.model_json_schema(), "changes": spec.changes.model_json_schema()}
                    for action, spec in ACTIONS.items()},
    }
