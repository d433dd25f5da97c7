"""Generic checkers that validate_manifests.py runs on deploy/:

  * yamllint (Debian package yamllint) with deploy/.yamllint: syntax, duplicate keys,
    indentation, trailing spaces, line length;
  * kubernetes-validate (PyPI, in a test-only venv; its wheel ships the Kubernetes API's JSON
    schemas, so it needs no network): every object, strict (unknown fields are errors), against
    the oldest and the newest Kubernetes version it knows;
  * the Grafana dashboard (grafana/*.json): the JSON parses, panels are well formed, and its
    PromQL names only the metric families that cohort-server exports (METRIC_FAMILIES), with their
    labels, and every family is on some panel.

Each function returns a list of problems (empty: passed).
"""
import json
import os
import re
import subprocess
import tempfile

# The families of cohort-server's GET /metrics (shard 0): name -> labels. Per-shard families
# carry shard="0".."S-1". A histogram is its _bucket (le), _sum and _count series.
PER_SHARD = {"shard"}
METRIC_FAMILIES = {
    "cohort_rounds_committed_total": set(),
    "cohort_rounds_failed_total": {"reason"},
    "cohort_round_duration_seconds_bucket": {"le"},
    "cohort_round_duration_seconds_sum": set(),
    "cohort_round_duration_seconds_count": set(),
    "cohort_round_train_seconds": set(),
    "cohort_round_comm_seconds": set(),
    "cohort_clients": {"state"},
    "cohort_updates_accepted_total": set(),
    "cohort_updates_refused_total": {"reason"},
    "cohort_test_accuracy": set(),
    "cohort_test_loss": set(),
    "cohort_train_loss": set(),
    "cohort_dp_epsilon": set(),
    "cohort_received_bytes_total": PER_SHARD,
    "cohort_sent_bytes_total": PER_SHARD,
    "cohort_push_bytes_total": PER_SHARD,
    "cohort_pull_bytes_total": PER_SHARD,
    "cohort_tls_handshakes_total": PER_SHARD,
    "cohort_tls_handshake_failures_total": PER_SHARD,
    "cohort_records_dropped_total": PER_SHARD | {"reason"},
    "cohort_checkpoint_age_seconds": PER_SHARD,
    "cohort_checkpoint_failures_total": PER_SHARD,
    "cohort_process_resident_memory_bytes": PER_SHARD,
}
TARGET_LABELS = {"job", "instance", "namespace", "pod"}  # added by Prometheus' scrape config
PROMQL_FUNCTIONS = {
    "rate", "irate", "increase", "delta", "deriv", "sum", "avg", "min", "max", "count", "topk",
    "bottomk", "histogram_quantile", "clamp_min", "clamp_max", "abs", "time", "vector", "scalar",
    "sort", "sort_desc", "max_over_time", "min_over_time", "avg_over_time", "last_over_time",
    "changes", "resets", "absent", "round",
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset", "inf", "nan"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "text", "heatmap"}
VARIABLE = re.compile(r"\$\{?\w+\}?")
KUBE_VERSIONS_NEEDED = 2  # the oldest and the newest schema version in the wheel


def yamllint(exe, config, files):
    if not exe:
        return ["yamllint not found (apt-get install yamllint)"]
    r = subprocess.run([exe, "--strict", "-c", config, "-f", "parsable", *files],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        return []
    return [f"yamllint: {line}" for line in (r.stdout + r.stderr).strip().splitlines()] or \
           [f"yamllint exited {r.returncode}"]


def kube_versions(exe):
    """The oldest and the newest Kubernetes version whose schemas kubernetes-validate ships."""
    py = os.path.join(os.path.dirname(exe), "python3")
    code = ("import kubernetes_validate, os; d = os.path.join(os.path.dirname(kubernetes_validate.__file__), "
            "'kubernetes-json-schema'); print('\\n'.join(os.listdir(d)))")
    r = subprocess.run([py if os.path.exists(py) else "python3", "-c", code], capture_output=True, text=True,
                       timeout=60)
    found = set()
    for name in r.stdout.split():
        m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-local-strict", name)
        if m:
            found.add(tuple(int(x) for x in m.groups()))
    if not found:
        return []
    return sorted({".".join(map(str, min(found))), ".".join(map(str, max(found)))})


def kubernetes_validate(exe, docs, where):
    """docs: [(origin, object)]. Validates each object, strictly, against the schemas in the wheel."""
    if not exe or not os.path.exists(exe):
        return [f"kubernetes-validate not found ({exe or 'not on PATH'}): make the test venv with "
                f"deploy/make-test-venv.sh DIR and set COHORT_KUBERNETES_VALIDATE=DIR/bin/kubernetes-validate"]
    versions = kube_versions(exe)
    if not versions:
        return [f"{exe}: no schemas found in its package"]
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for k, (origin, obj) in enumerate(docs):
            if obj.get("kind") == "Kustomization":
                continue  # not a Kubernetes API object; kubectl kustomize checks it
            path = os.path.join(tmp, f"{k:03d}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(obj, f)
            paths[path] = f"{origin} {obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        for version in versions:
            r = subprocess.run([exe, "--strict", "--quiet", "--no-warn", "-k", version, *sorted(paths)],
                               capture_output=True, text=True, timeout=120)
            out = (r.stdout + r.stderr).strip()
            for path, what in paths.items():
                out = out.replace(path, what)
            if r.returncode != 0 or "ERROR" in out:
                problems.append(f"{where}: kubernetes-validate --strict -k {version}:\n{out}")
    return problems


def _strip(expr):
    expr = VARIABLE.sub("x", expr)              # Grafana variables: $shard, $__rate_interval, ${x}
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    return re.sub(r"\[[^\]]*\]", "", expr)       # range selectors [5m]


def promql_problems(expr):
    """Metric names, labels and functions of one PromQL expression. Returns (problems, families)."""
    problems, families, labels = [], set(), set()
    body = _strip(expr)
    for m in re.finditer(r"\{([^}]*)\}", body):
        labels |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(1)))
    for m in re.finditer(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", body):
        labels |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    body = re.sub(r"\{[^}]*\}", "", body)
    body = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", body)
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", body):
        word, call = m.group(1), m.group(2)
        if call:
            if word not in PROMQL_FUNCTIONS:
                problems.append(f"unknown function {word}()")
        elif word in METRIC_FAMILIES:
            families.add(word)
        elif word not in PROMQL_WORDS:
            problems.append(f"{word} is not a metric family of cohort-server")
    allowed = set().union(*(METRIC_FAMILIES[f] for f in families)) | TARGET_LABELS if families else TARGET_LABELS
    for label in sorted(labels - allowed):
        problems.append(f"label {label!r} is not a label of {sorted(families)}")
    if not families:
        problems.append("names no metric family")
    return problems, families


def walk_panels(panels):
    for p in panels or []:
        yield p
        yield from walk_panels(p.get("panels"))


def dashboard_queries(dash):
    return [t.get("expr") or "" for p in walk_panels(dash.get("panels")) for t in p.get("targets") or []]


def promtool_check(exe, path):
    """PromQL syntax of every query, by Prometheus' own parser (`promtool check rules`)."""
    with open(path, encoding="utf-8") as f:
        exprs = dashboard_queries(json.load(f))
    rules = [{"record": f"cohort:dashboard_query_{k}",
              "expr": e.replace("$__rate_interval", "5m").replace("$shard", ".*")} for k, e in enumerate(exprs)]
    with tempfile.TemporaryDirectory() as tmp:
        rules_file = os.path.join(tmp, "rules.json")  # JSON is YAML
        with open(rules_file, "w", encoding="utf-8") as f:
            json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        r = subprocess.run([exe, "check", "rules", rules_file], capture_output=True, text=True, timeout=60)
    return [] if r.returncode == 0 else [f"{path}: promtool check rules:\n{r.stdout}{r.stderr}"]


def grafana_dashboard(path):
    problems = []
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return [f"{path}: {e}"]
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in dash:
            problems.append(f"{path}: no {key}")
    variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list") or []}
    ds = variables.get("datasource") or {}
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append(f"{path}: no Prometheus data source variable named datasource")
    shard = variables.get("shard") or {}
    q = shard.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    m = re.fullmatch(r"label_values\((\w+),\s*shard\)", q or "")
    if not m or "shard" not in METRIC_FAMILIES.get(m.group(1), set()):
        problems.append(f"{path}: variable shard is not label_values(<a per-shard family>, shard): {q!r}")
    ids, used = set(), set()
    for p in walk_panels(dash.get("panels")):
        tag = f"{path}: panel {p.get('id')} {p.get('title')!r}"
        if p.get("id") in ids:
            problems.append(f"{tag}: duplicate id")
        ids.add(p.get("id"))
        if p.get("type") not in PANEL_TYPES:
            problems.append(f"{tag}: unknown type {p.get('type')!r}")
        grid = p.get("gridPos") or {}
        if not all(isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")) or grid.get("x", 0) + grid.get("w", 0) > 24:
            problems.append(f"{tag}: bad gridPos {grid}")
        if p.get("type") == "row":
            continue
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"{tag}: no queries")
        for t in targets:
            if (t.get("datasource") or p.get("datasource") or {}).get("uid") != "${datasource}":
                problems.append(f"{tag} query {t.get('refId')}: data source is not ${{datasource}}")
            bad, families = promql_problems(t.get("expr") or "")
            used |= families
            problems += [f"{tag} query {t.get('refId')} `{t.get('expr')}`: {b}" for b in bad]
    for family in sorted(set(METRIC_FAMILIES) - used):
        problems.append(f"{path}: no panel shows {family}")
    return problems
