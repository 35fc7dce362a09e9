"""Read an llm-d ``EndpointPickerConfig`` YAML file into weighted scorers and a picker.

The schema is llm-d's (``llm-d-inference-scheduler`` ``apix/config/v1alpha1/
endpointpickerconfig_types.go``; before June 2026 in ``gateway-api-inference-extension``)::

    apiVersion: inference.networking.x-k8s.io/v1alpha1     (or llm-d.ai/v1alpha1)
    kind: EndpointPickerConfig
    plugins:            [{type, name (default: the type), parameters}]
    schedulingProfiles: [{name, plugins: [{pluginRef, weight}]}]

with the loader's defaults (``pkg/epp/config/loader/defaults.go``, ``validation.go``): a scorer
without a weight weighs 1; a profile without a picker gets ``max-score-picker``; no profile at
all means one profile of every scorer and picker; a ``pluginRef`` must name a plugin. One
profile only (the prefill/decode profiles of disaggregated serving are not simulated).

Plugins (``epp_scorers`` for the scorers):

- ``queue-scorer``, ``kv-cache-utilization-scorer`` (old name ``kv-cache-scorer``),
  ``load-aware-scorer`` (``threshold``);
- ``prefix-cache-scorer``: the estimated form, with the approximate index's parameters on it
  (gateway-api-inference-extension v1.x) or on an ``approx-prefix-cache-producer`` plugin
  (llm-d since 2026): ``autoTune`` (default true: block size and LRU capacity from the
  servers), ``blockSizeTokens``, ``blockSize`` (characters, 4 per token), ``hashBlockSize``
  (the same, v1.0), ``maxPrefixBlocksToMatch`` (256), ``maxPrefixTokensToMatch``,
  ``lruCapacityPerServer`` (31250). With ``mode: cache_tracking`` (llm-d before v0.3,
  ``pkg/plugins/scorer/prefix_cache.go``) it is the precise scorer;
- ``precise-prefix-cache-scorer`` (``tokenProcessorConfig.blockSize``, also under
  ``indexerConfig``; ``speculativeIndexing`` is not simulated and refused when true);
- ``max-score-picker`` (``maxNumOfEndpoints`` 1), ``weighted-random-picker``, ``random-picker``;
- no effect here: ``single-profile-handler``, ``decode-filter`` (every worker decodes),
  ``tokenizer``, ``token-producer``, ``metrics-data-source``, ``core-metrics-extractor``,
  ``endpoint-notification-source``.

Anything else is an ``InputError``: one line naming the file, line and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kvroute.sim.routing.epp_scorers import (DEFAULT_LRU_CAPACITY, DEFAULT_MAX_PREFIX_BLOCKS, KVCacheUtilizationScorer,
                                             LoadAwareScorer, PrecisePrefixCacheScorer, PrefixCacheScorer, QueueScorer,
                                             Scorer)
from kvroute.traces.inputs import InputError
from kvroute.traces.yaml_doc import (MARKDOWN_SUFFIXES, LineMap, YamlSource, markdown_yaml_blocks, parse_yaml,
                                     read_text)

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
PICKER_TYPES = {"max-score-picker": "max", "weighted-random-picker": "weighted", "random-picker": "random"}
SCORER_TYPES = ("queue-scorer", "kv-cache-utilization-scorer", "kv-cache-scorer", "load-aware-scorer",
                "prefix-cache-scorer", "precise-prefix-cache-scorer")
PRODUCER_TYPES = ("approx-prefix-cache-producer",)
NO_EFFECT_TYPES = ("single-profile-handler", "decode-filter", "tokenizer", "token-producer", "metrics-data-source",
                   "core-metrics-extractor", "endpoint-notification-source")
TOP_LEVEL = ("apiVersion", "kind", "plugins", "schedulingProfiles", "featureGates", "dataLayer",
             "saturationDetector", "flowControl", "parser")
CHARS_PER_TOKEN = 4
"""llm-d's ``averageCharactersPerToken`` (``approximateprefix/types.go``)."""


@dataclass(frozen=True)
class EndpointPickerConfig:
    """What a file configures: ``(scorer, weight)`` pairs in profile order and the picker."""

    scorers: list[tuple[Scorer, float]]
    picker: str


class _Reader(YamlSource):
    def fail(self, reason: str, node=None, field: str | None = None, key=None) -> InputError:
        return self.error(reason, node, key, field)

    def mapping(self, node, field: str, parent=None, key=None) -> LineMap:
        """``node`` if it is a mapping; else an error at ``parent[key]``'s line (a list index or a key)."""
        if not isinstance(node, dict):
            raise self.fail(f"expected a mapping, got {type(node).__name__}", parent, field, key)
        return node

    def number(self, params: LineMap, key: str, field: str, default, integer: bool = True, minimum: float = 0):
        if key not in params or params[key] is None:
            return default
        value = params[key]
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not integer:
            ok = ok or isinstance(value, float) and value == value and abs(value) != float("inf")
        if not ok or value < minimum:
            kind = "an integer" if integer else "a number"
            raise self.fail(f"must be {kind} >= {minimum}, got {value!r}", params, f"{field}.{key}", key)
        return value


def config_file(config: str | Path) -> str:
    """The file a config reference reads: ``REPORT.md#NAME`` -> ``REPORT.md``; any other as given."""
    head, sep, _ = str(config).rpartition("#")
    return head if sep and head.lower().endswith(MARKDOWN_SUFFIXES) else str(config)


def _markdown_config(text: str, where: str, name: str) -> tuple[str, int]:
    """The EndpointPickerConfig block of a Markdown report (a fenced YAML block with ``kind:
    EndpointPickerConfig``) named ``name``, or the only one when ``name`` is empty, and the lines
    before it. A block's name is the text of the line above it (``**precise-scheduling**``, ``###
    precise-scheduling``), without its Markdown marks.

    Raises:
        InputError: no such block; several and no name (listing their names).
    """
    blocks = [(block, offset, label) for block, offset, label in markdown_yaml_blocks(text)
              if re.search(r"^kind:\s*EndpointPickerConfig\s*$", block, re.M)]
    names = ", ".join(label or "(unnamed)" for _, _, label in blocks)
    if not blocks:
        raise InputError("no ```yaml block with 'kind: EndpointPickerConfig'", where)
    if name:
        found = next((block for block in blocks if block[2] == name), None)
        if found is None:
            raise InputError(f"no EndpointPickerConfig block named {name!r}; the file's: {names}", where)
        return found[0], found[1]
    if len(blocks) > 1:
        raise InputError(f"{len(blocks)} EndpointPickerConfig blocks ({names}): name one, as epp:{where}#NAME", where)
    return blocks[0][0], blocks[0][1]


def read_endpoint_picker_config(path: str | Path) -> EndpointPickerConfig:
    """Parse an EndpointPickerConfig YAML file, or one of a Markdown report's (``.md``): the
    only one it holds (``REPORT.md``) or the one named ``NAME`` (``REPORT.md#NAME``, the line
    above its block: :func:`_markdown_config`), as llm-d's benchmark reports print them.

    Raises:
        InputError: the file cannot be read or parsed, or a field is missing, of the wrong type,
            names an unknown plugin type or an undefined plugin, or asks for what is not
            simulated; one line naming the file, line (in the ``.md`` file for a report) and
            field.
    """
    where, file = str(path), config_file(path)
    text, offset = read_text(file), 0
    if file.lower().endswith(MARKDOWN_SUFFIXES):
        text, offset = _markdown_config(text, file, where[len(file) + 1:])
    r = _Reader(file, offset)
    doc = parse_yaml(text, file, offset, track_lines=True)
    if not isinstance(doc, dict):
        raise InputError("expected an EndpointPickerConfig mapping", file)
    for key in doc:
        if key not in TOP_LEVEL:
            raise r.fail(f"unknown field; an EndpointPickerConfig has {', '.join(TOP_LEVEL)}", doc, str(key), key)
    if doc.get("kind") != "EndpointPickerConfig":
        raise r.fail(f"must be EndpointPickerConfig, got {doc.get('kind')!r}", doc, "kind", "kind")
    if doc.get("apiVersion") not in API_VERSIONS:
        raise r.fail(f"must be one of {', '.join(API_VERSIONS)}, got {doc.get('apiVersion')!r}", doc, "apiVersion",
                     "apiVersion")
    plugins = doc.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise r.fail("must be a non-empty list of {type, name, parameters}", doc, "plugins", "plugins")
    specs: dict[str, tuple[str, LineMap, str]] = {}  # name -> (type, parameters, field)
    defined: dict[str, tuple[LineMap, str]] = {}  # name -> (its plugins entry, that entry's field)
    for i, item in enumerate(plugins):
        field = f"plugins[{i}]"
        item = r.mapping(item, field, plugins, i)
        kind = item.get("type")
        if not isinstance(kind, str) or not kind:
            raise r.fail("missing 'type'", item, f"{field}.type")
        known = SCORER_TYPES + tuple(PICKER_TYPES) + PRODUCER_TYPES + NO_EFFECT_TYPES
        if kind not in known:
            raise r.fail(f"unknown plugin type {kind!r}; kvroute simulates {', '.join(known)}", item,
                         f"{field}.type", "type")
        name = item.get("name") or kind
        if name in specs:
            raise r.fail(f"plugin name {name!r} is defined twice", item, f"{field}.name", "name")
        params = item.get("parameters")
        params = LineMap() if params is None else r.mapping(params, f"{field}.parameters", item, "parameters")
        specs[name] = (kind, params, f"{field}.parameters")
        defined[name] = (item, field)
    producers = [(p, f) for k, p, f in specs.values() if k in PRODUCER_TYPES]
    profiles = doc.get("schedulingProfiles")
    if profiles is None:
        refs = [(name, 1.0, *defined[name]) for name, (kind, _, _) in specs.items()
                if kind in SCORER_TYPES or kind in PICKER_TYPES]
    else:
        if not isinstance(profiles, list) or not profiles:
            raise r.fail("must be a non-empty list of profiles", doc, "schedulingProfiles", "schedulingProfiles")
        if len(profiles) > 1:
            raise r.fail("more than one scheduling profile (disaggregated prefill/decode) is not simulated; give one",
                         doc, "schedulingProfiles", "schedulingProfiles")
        profile = r.mapping(profiles[0], "schedulingProfiles[0]", profiles, 0)
        if not profile.get("name"):
            raise r.fail("missing a name", profile, "schedulingProfiles[0].name")
        entries = profile.get("plugins")
        if not isinstance(entries, list):
            raise r.fail("must be a list of {pluginRef, weight}", profile, "schedulingProfiles[0].plugins", "plugins")
        refs = []
        for j, entry in enumerate(entries):
            field = f"schedulingProfiles[0].plugins[{j}]"
            entry = r.mapping(entry, field, entries, j)
            ref = entry.get("pluginRef")
            if not isinstance(ref, str) or not ref:
                raise r.fail("missing 'pluginRef'", entry, f"{field}.pluginRef")
            if ref not in specs:
                raise r.fail(f"names no plugin defined under plugins ({', '.join(specs)})", entry, f"{field}.pluginRef",
                             "pluginRef")
            weight = r.number(entry, "weight", field, 1.0, integer=False)
            refs.append((ref, float(weight), entry, field))
    scorers: list[tuple[Scorer, float]] = []
    picker = None
    for ref, weight, where, where_field in refs:
        kind, params, field = specs[ref]
        if kind in PICKER_TYPES:
            if picker is not None:  # named at the second picker's entry (the profile's, else its plugin's)
                raise r.fail(f"a second picker ({ref!r}); the profile takes one", where, where_field)
            count = r.number(params, "maxNumOfEndpoints", field, 1, minimum=1)
            if count != 1:
                raise r.fail("only 1 endpoint per request is simulated", params, f"{field}.maxNumOfEndpoints",
                             "maxNumOfEndpoints")
            picker = PICKER_TYPES[kind]
        elif kind in SCORER_TYPES:
            scorers.append((_scorer(r, kind, params, field, producers), weight))
    return EndpointPickerConfig(scorers, picker or "max")


def _scorer(r: _Reader, kind: str, params: LineMap, field: str, producers) -> Scorer:
    if kind == "queue-scorer":
        return QueueScorer()
    if kind in ("kv-cache-utilization-scorer", "kv-cache-scorer"):
        return KVCacheUtilizationScorer()
    if kind == "load-aware-scorer":
        return LoadAwareScorer(r.number(params, "threshold", field, 128, minimum=1))
    mode = params.get("mode", "estimate") if kind == "prefix-cache-scorer" else "cache_tracking"
    if mode not in ("estimate", "cache_tracking"):
        raise r.fail(f"must be estimate or cache_tracking, got {mode!r}", params, f"{field}.mode", "mode")
    if mode == "cache_tracking":
        return _precise(r, params, field)
    if producers:  # llm-d since 2026: the index's parameters are the producer's
        params, field = producers[0]
    auto = params.get("autoTune", True)
    if not isinstance(auto, bool):
        raise r.fail(f"must be true or false, got {auto!r}", params, f"{field}.autoTune", "autoTune")
    tokens = r.number(params, "blockSizeTokens", field, 0)
    chars = r.number(params, "blockSize", field, 0) or r.number(params, "hashBlockSize", field, 0)
    if not tokens and chars:
        if chars % CHARS_PER_TOKEN:
            raise r.fail(f"{chars} characters is not a whole number of tokens at {CHARS_PER_TOKEN} characters per "
                         "token; use blockSizeTokens", params, f"{field}.blockSize", "blockSize")
        tokens = chars // CHARS_PER_TOKEN
    # 0 or absent: llm-d's default (gateway-api-inference-extension v1.3.0 replaces values <= 0)
    max_blocks = r.number(params, "maxPrefixBlocksToMatch", field, 0) or DEFAULT_MAX_PREFIX_BLOCKS
    max_tokens = r.number(params, "maxPrefixTokensToMatch", field, 0)
    capacity = r.number(params, "lruCapacityPerServer", field, 0)
    if not auto and not tokens:
        raise r.fail("must be > 0 when autoTune is false", params, f"{field}.blockSizeTokens", "blockSizeTokens")
    # autoTune takes block size and capacity from the servers; a capacity given is the fallback
    # (gateway-api-inference-extension v1.3.0 plugin.go, makeServer)
    if auto:
        return PrefixCacheScorer(0, 0, max_blocks, max_tokens, capacity or DEFAULT_LRU_CAPACITY)
    return PrefixCacheScorer(tokens, capacity or DEFAULT_LRU_CAPACITY, max_blocks, max_tokens)


def _precise(r: _Reader, params: LineMap, field: str) -> Scorer:
    if params.get("speculativeIndexing"):
        raise r.fail("speculative indexing is not simulated; remove it or set it false", params,
                     f"{field}.speculativeIndexing", "speculativeIndexing")
    size, where, line = 0, field, r.line(params)
    for parent in (params, params.get("indexerConfig")):
        if isinstance(parent, dict) and isinstance(parent.get("tokenProcessorConfig"), dict):
            tpc = parent["tokenProcessorConfig"]
            prefix = field + (".indexerConfig" if parent is not params else "") + ".tokenProcessorConfig"
            size, where = r.number(tpc, "blockSize", prefix, 0, minimum=1), f"{prefix}.blockSize"
            line = r.line(tpc, "blockSize")
    # llm-d-kv-cache-manager's default token processor block size is 16 (kvblock/token_processor.go)
    scorer = PrecisePrefixCacheScorer(size or 16)
    scorer.source = f"{r.where}:{line}: field '{where}'" if line is not None else f"{r.where}: field '{where}'"
    return scorer
