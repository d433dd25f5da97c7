#!/usr/bin/python3
"""Checks Cohort's deployment files: Kubernetes manifests, the Secret generator and the Slurm script.

    /usr/bin/python3 deploy/validate_manifests.py deploy

Generic checks (deploy/generic_checks.py; always run, a missing tool is a failure):
  * yamllint --strict -c deploy/.yamllint on every YAML file;
  * kubernetes-validate --strict (COHORT_KUBERNETES_VALIDATE, else PATH; make-test-venv.sh) on
    every object as written and as kustomize builds it, against the API schemas in its wheel;
  * grafana/*.json parses and its PromQL names only cohort-server's metric families, all of them;
    with promtool (Debian prometheus) found, Prometheus' parser accepts every query.
Static checks (always run; need python3-yaml):
  * configuration keys, in the ConfigMap's TOML and in `--section.key=value` flags, are keys of the
    real binaries (SERVER_KEYS / CLIENT_KEYS below, cross-checked with --help when they are built):
    unknown keys are errors at start-up; server.metrics_port in particular does not exist;
  * every *.yaml / *.yml under the folder loads, all documents; objects carry metadata.name
    (DNS-1123) and the app.kubernetes.io/part-of=cohort label; kustomizations name
    files that exist; patches target objects that exist;
  * the StatefulSet's serviceName is a headless Service (clusterIP: None) whose selector matches
    the pods; selectors match template labels; named ports exist;
  * every volumeMount has a volume or claim template; every Secret / ConfigMap a pod uses exists
    (the Secret template in k8s/templates) with the keys the pods read (shard-<i> for i < replicas,
    client-<i> for i < completions); ConfigMap items exist and their TOML parses;
  * shards: command runs cohort-server with --shard from the hostname ordinal, --shards, --listen
    tcp://0.0.0.0:PORT, --name shard-<i>, --coordinator, --config and --server.advertise
    tcp://$HOSTNAME.<service>:PORT; COHORT_SHARDS = replicas; the ports are the protocol port
    7000 and shard 0's metrics port http 9100 (--server.http=0.0.0.0:$COHORT_HTTP_PORT, the
    prometheus.io/* annotations with scheme https, NetworkPolicy from the monitoring namespace
    only; no Service port); startup/readiness/liveness probes are tcpSocket probes on 7000; server.checkpoint_dir and server.metrics_file are on the claim;
    clients_per_round and min_clients do not exceed the Job's completions;
  * clients: Job with completionMode Indexed, command runs cohort-client with --name
    client-<index>, --part <index>/$COHORT_CLIENTS (index = JOB_COMPLETION_INDEX) and --server
    pointing at <statefulset>-0.<service>:<port>; data.seed is not set per pod;
  * containers: resources, non-root, no privilege escalation, capabilities dropped;
  * no file holds key material; inline `sh -c` scripts pass `sh -n`; every *.sh / *.sbatch has a
    shebang, is executable and passes `bash -n` (and `shellcheck -S error` when installed).
  * mutation self-test: known mistakes (a metrics_port key, no --part, no advertise, an HTTP
    probe, ...) are applied one at a time to a copy of the folder, and each must fail the checks.
Functional checks (run when their tools are found, else reported as skipped):
  * with the built cohort-server / cohort-client (COHORT_SERVER_BIN, COHORT_CLIENT_BIN or
    build*/bin): the key lists above equal --help's; every pod's inline script is run for every
    shard ordinal and client index against the real binary with --print-config (config mounted
    from the ConfigMap), which must accept it and yield the expected shard, advertise url,
    coordinator, name, part, ...; then 2 shards and the Job's clients run a real round on
    localhost from the ConfigMap's TOML (needs data.dir), exit 0, and restarted shards finish again
    at once (what the README says about StatefulSet restarts);
  * `kubectl kustomize` builds every kustomization and the result passes the checks above;
  * k8s/make-secrets.sh with cohort-keygen + kubectl: Secrets with exactly the keys the pods read,
    file mode 0600, no key material on stdout/stderr, no temporary files left;
  * slurm/cohort.sbatch under stub srun/scontrol and stub cohort binaries: placement, flags
    (--part, --server.advertise, no metrics port), certificate folder mode 0700 without the CA
    key, clean-up after success and after SIGTERM; with the built binaries, every task's argv is
    also fed to the real binary with --print-config.
Exit status 0 when everything passes, 1 otherwise.
"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generic_checks  # noqa: E402  (deploy/generic_checks.py: yamllint, kubernetes-validate, Grafana)

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Built from pieces so that this file does not match itself.
PEM_PRIVATE = re.compile("-----BEGIN [A-Z ]*" + "PRIVATE KEY-----")
B64_PEM_ANY = "LS0tLS1" + "CRUdJTi"  # base64 of "-----BEGIN"
WORKLOADS = {"StatefulSet", "Deployment", "DaemonSet", "Job", "ReplicaSet"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition", "PriorityClass"}

# The binaries' configuration keys, as `cohort-server --help` / `cohort-client --help` list them.
# Unknown keys are errors at start-up. When the binaries are built, these lists are compared with
# --help, so they cannot drift silently.
SERVER_KEYS = {
    "server.shard", "server.shards", "server.listen", "server.coordinator", "server.advertise",
    "server.name", "server.port_file", "server.mode", "server.rounds", "server.consistency",
    "server.staleness", "server.steps", "server.buffer_size", "server.max_staleness",
    "server.concurrency", "server.clients_per_round", "server.overselect", "server.min_clients",
    "server.min_updates", "server.max_failed_rounds", "server.selection", "server.round_deadline_ms", "server.eval_every",
    "server.seed", "server.heartbeat_ms", "server.client_timeout_ms", "server.checkpoint_dir",
    "server.checkpoint_every", "server.metrics_file", "model.spec", "model.seed", "tls.insecure",
    "tls.ca_file", "tls.cert_file", "tls.key_file", "tls.coordinator_name", "transport.chunk_kib", "transport.receive_queue",
    "transport.aead",
    "dp.clip", "dp.noise_multiplier", "dp.delta", "dp.seed",
    "server.normalization", "server.work", "server.min_local_steps", "server.max_local_steps",
    "server.deadline_margin", "server.batch_policy", "server.max_worker_batch",
    "server.rebalance_every", "server.secure_aggregation", "secagg.stage_ms", "secagg.clip",
    "secagg.levels", "secagg.threshold", "secagg.degree", "metrics.tensorboard_dir",
    "server.http", "server.http_port_file", "server.http_linger_ms",
}
CLIENT_KEYS = {
    "client.server", "client.name", "client.device", "client.threads", "client.connect_timeout_ms",
    "client.backoff_max_ms", "client.step_delay_ms", "data.dir", "data.partition", "data.part",
    "data.seed", "tls.insecure", "tls.ca_file", "tls.cert_file", "tls.key_file", "tls.coordinator_name",
    "transport.chunk_kib", "transport.aead", "client.mode", "client.attack", "client.attack_scale", "client.dp_clip",
    "peer.listen", "peer.advertise", "peer.handshake_timeout_ms", "client.memory_budget",
    "data.format", "data.train", "data.test", "data.train_labels", "data.test_labels", "data.label",
    "data.header", "data.delimiter", "data.shape", "data.scale", "data.arrays", "data.test_arrays",
}
# Plug-in sections (any key, checked by the plug-in at start-up).
SERVER_SECTIONS = {"train", "aggregator", "server_optimizer", "decentralized"}
CLIENT_SECTIONS = {"compressor"}
# [train] options the clients accept (client/trainer.cc, trainer_options_from).
TRAIN_KEYS = {
    "batch_size", "epochs", "steps", "drop_last", "optimizer", "lr", "momentum", "nesterov",
    "weight_decay", "beta1", "beta2", "epsilon", "lr_schedule", "prox_mu", "reset_optimizer_state",
    "eval_batch_size", "device", "threads", "memory_budget", "rule", "loss",
}
SERVER_MODES = {"federated", "fedbuff", "dataparallel", "decentralized"}
# Keys of the guessed contract that the binaries do not have, with what to do instead.
REMOVED_KEYS = {
    "server.metrics_port": "shard 0 serves /metrics at server.http (host:port); there is no "
                           "metrics_port",
}
DATASET_DIR = "/usr/share/datasets/fashion-mnist"  # data.dir's default: Debian dataset-fashion-mnist
PROTOCOL_PORT = 7000
HTTP_PORT = 9100  # shard 0's server.http in the pods: /metrics, the dashboard, /api/v1
# The pod annotations of the shards (Prometheus' kubernetes-pods scrape convention).
SCRAPE_ANNOTATIONS = {"prometheus.io/scrape": "true", "prometheus.io/port": str(HTTP_PORT),
                      "prometheus.io/path": "/metrics", "prometheus.io/scheme": "https"}
MONITORING_NAMESPACE = "monitoring"


class Report:
    def __init__(self, quiet=False):
        self.failures = []
        self.passed = 0
        self.quiet = quiet

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failures.append(what)
        return cond

    def fail(self, what):
        self.failures.append(what)

    def note(self, what):
        if not self.quiet:
            print(what)


R = Report()


# ----------------------------------------------------------------------------------------------
# Loading


def yaml_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith((".yaml", ".yml")):
                out.append(os.path.join(dirpath, f))
    return out


def load_docs(files):
    """[(file, index, doc)] for every non-empty document."""
    docs = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                for i, doc in enumerate(yaml.safe_load_all(f)):
                    if doc is None:
                        continue
                    if not isinstance(doc, dict):
                        R.fail(f"{path} document {i}: not a mapping")
                        continue
                    docs.append((path, i, doc))
        except yaml.YAMLError as e:
            R.fail(f"{path}: YAML does not parse: {e}")
    return docs


def labels_of(obj):
    return ((obj.get("metadata") or {}).get("labels")) or {}


def pod_spec(obj):
    return (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}


def containers(obj, init=True):
    ps = pod_spec(obj)
    cs = list(ps.get("containers") or [])
    if init:
        cs += list(ps.get("initContainers") or [])
    return cs


def command_text(c):
    return " ".join(str(x) for x in (c.get("command") or []) + (c.get("args") or []))


def env_value(c, name):
    for e in c.get("env") or []:
        if e.get("name") == name:
            return e.get("value")
    return None


def subset(small, big):
    return bool(small) and all(big.get(k) == v for k, v in small.items())


def port_matches(ref, c):
    for p in c.get("ports") or []:
        if ref == p.get("name") or ref == p.get("containerPort"):
            return p
    return None


def probe_port(probe):
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in (probe or {}):
            return probe[kind].get("port")
    return None


def flatten(cfg, prefix=""):
    """{"server": {"rounds": 3}} -> {"server.rounds": 3} (tables of any depth)."""
    out = {}
    for k, v in (cfg or {}).items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def key_problem(key, role):
    """Why `key` (section.key) is not a configuration key of cohort-<role>, or None."""
    if key in REMOVED_KEYS:
        return f"{key} does not exist: {REMOVED_KEYS[key]}"
    section, _, name = key.partition(".")
    if role == "server":
        if section in SERVER_SECTIONS:
            if section == "train" and name not in TRAIN_KEYS:
                return f"{key} is not a training option (known: {', '.join(sorted(TRAIN_KEYS))})"
            return None
        known = SERVER_KEYS
    else:
        if section in CLIENT_SECTIONS:
            return None
        known = CLIENT_KEYS
    if key not in known:
        return f"{key} is not a cohort-{role} configuration key (unknown keys are errors at start-up)"
    return None


def check_config_keys(tag, cfg, role):
    """The TOML file holds only keys that cohort-<role> accepts, with sane values."""
    flat = flatten(cfg)
    for key in sorted(flat):
        problem = key_problem(key, role)
        R.check(problem is None, f"{tag}: config {problem}")
    if role == "server":
        for section in ("aggregator", "server_optimizer"):
            if section in (cfg or {}):
                R.check(isinstance(cfg[section].get("name"), str),
                        f"{tag}: config [{section}] has no name")
        mode = flat.get("server.mode", "federated")
        R.check(mode in SERVER_MODES, f"{tag}: config server.mode {mode!r} is not one of {sorted(SERVER_MODES)}")
    return flat


FLAG_KEY = re.compile(r"--([a-z_]+\.[a-z_.]+)=")


def check_flag_keys(tag, text, role):
    """Every --section.key=value flag in a command names a key of cohort-<role>."""
    for key in sorted(set(FLAG_KEY.findall(text))):
        problem = key_problem(key, role)
        R.check(problem is None, f"{tag}: flag --{key}: {problem}")


# ----------------------------------------------------------------------------------------------
# Structure of a set of objects (the files as written, or a kustomize build)


def check_objects(objs, where, secret_pool=None, config_toml=None):
    """objs: [(origin, doc)]. secret_pool: Secret docs to resolve references against."""
    by_kind = {}
    for origin, o in objs:
        by_kind.setdefault(o.get("kind"), []).append((origin, o))
    secrets = {(s.get("metadata") or {}).get("name"): s for _, s in (secret_pool or [])}
    secrets.update({(s.get("metadata") or {}).get("name"): s for _, s in by_kind.get("Secret", [])})
    configmaps = {o["metadata"]["name"]: o for _, o in by_kind.get("ConfigMap", [])}
    services = {o["metadata"]["name"]: o for _, o in by_kind.get("Service", [])}
    namespaces = [o["metadata"]["name"] for _, o in by_kind.get("Namespace", [])]

    for origin, o in objs:
        md = o.get("metadata") or {}
        name = md.get("name")
        tag = f"{where}: {origin} {o.get('kind')}/{name}"
        if not R.check(isinstance(name, str) and DNS1123.match(name or "") is not None,
                       f"{tag}: metadata.name missing or not a DNS-1123 name"):
            continue
        R.check(labels_of(o).get("app.kubernetes.io/part-of") == "cohort",
                f"{tag}: label app.kubernetes.io/part-of=cohort missing")
        if o.get("kind") not in CLUSTER_SCOPED and namespaces:
            R.check(md.get("namespace") in namespaces,
                    f"{tag}: namespace {md.get('namespace')!r} is not the Namespace {namespaces}")

    # ConfigMaps: TOML entries parse.
    tomls = {}
    for origin, cm in by_kind.get("ConfigMap", []):
        for key, text in (cm.get("data") or {}).items():
            if key.endswith(".toml"):
                try:
                    tomls[(cm["metadata"]["name"], key)] = tomllib.loads(text)
                except tomllib.TOMLDecodeError as e:
                    R.fail(f"{where}: {origin} ConfigMap {cm['metadata']['name']} key {key}: {e}")

    # NetworkPolicies admit the protocol port, and the metrics port from the monitoring namespace only.
    for origin, np_ in by_kind.get("NetworkPolicy", []):
        metrics_rule = False
        for rule in (np_.get("spec") or {}).get("ingress") or []:
            peers = rule.get("from") or []
            monitoring = bool(peers) and all(
                set(x) == {"namespaceSelector"}
                and ((x["namespaceSelector"] or {}).get("matchLabels") or {})
                == {"kubernetes.io/metadata.name": MONITORING_NAMESPACE} for x in peers)
            for p in rule.get("ports") or []:
                ntag = f"{where}: {origin} NetworkPolicy/{np_['metadata']['name']}: port {p.get('port')!r}"
                if p.get("port") in ("http", HTTP_PORT):
                    metrics_rule = True
                    R.check(monitoring, f"{ntag}: the metrics port is open to more than the namespace "
                                        f"{MONITORING_NAMESPACE!r} (namespaceSelector only)")
                else:
                    R.check(p.get("port") in ("cohort", PROTOCOL_PORT),
                            f"{ntag} is neither the protocol port {PROTOCOL_PORT} nor the metrics port {HTTP_PORT}")
        R.check(metrics_rule, f"{where}: {origin} NetworkPolicy/{np_['metadata']['name']}: no rule admits the "
                              f"metrics port {HTTP_PORT} from the namespace {MONITORING_NAMESPACE!r}")

    # Services.
    headless = {n: s for n, s in services.items() if (s.get("spec") or {}).get("clusterIP") == "None"}

    stss = by_kind.get("StatefulSet", [])
    jobs = by_kind.get("Job", [])
    R.check(len(stss) == 1, f"{where}: expected one StatefulSet (the shards), found {len(stss)}")
    R.check(len(jobs) == 1, f"{where}: expected one Job (the clients), found {len(jobs)}")
    R.check(bool(headless), f"{where}: no headless Service (clusterIP: None)")

    for origin, w in [x for k in sorted(WORKLOADS) for x in by_kind.get(k, [])]:
        check_workload(where, origin, w, secrets, configmaps, tomls)

    sts_info = None
    for origin, sts in stss:
        sts_info = check_statefulset(where, origin, sts, headless, tomls)
    for origin, job in jobs:
        check_job(where, origin, job, sts_info, tomls)
    return by_kind


def check_workload(where, origin, w, secrets, configmaps, tomls):
    name = w["metadata"]["name"]
    tag = f"{where}: {origin} {w['kind']}/{name}"
    spec = w.get("spec") or {}
    tmpl_labels = labels_of(spec.get("template") or {})
    if w["kind"] != "Job" or (spec.get("selector") or {}).get("matchLabels"):
        R.check(subset((spec.get("selector") or {}).get("matchLabels") or {}, tmpl_labels),
                f"{tag}: selector.matchLabels is not a subset of the pod template's labels")
    ps = pod_spec(w)
    volumes = {v.get("name"): v for v in ps.get("volumes") or []}
    claims = {(c.get("metadata") or {}).get("name") for c in spec.get("volumeClaimTemplates") or []}
    pod_sc = ps.get("securityContext") or {}
    R.check(bool(containers(w, init=False)), f"{tag}: no containers")

    for c in containers(w):
        ctag = f"{tag} container {c.get('name')}"
        R.check(bool(c.get("image")), f"{ctag}: image missing")
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                R.check(r in (res.get(part) or {}), f"{ctag}: resources.{part}.{r} missing")
        sc = c.get("securityContext") or {}
        R.check(sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True,
                f"{ctag}: runAsNonRoot is not set")
        R.check(sc.get("allowPrivilegeEscalation") is False,
                f"{ctag}: allowPrivilegeEscalation must be false")
        R.check("ALL" in ((sc.get("capabilities") or {}).get("drop") or []),
                f"{ctag}: capabilities.drop must contain ALL")
        for m in c.get("volumeMounts") or []:
            R.check(m.get("name") in volumes or m.get("name") in claims,
                    f"{ctag}: volumeMount {m.get('name')!r} has no volume or claim template")
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe_name in c:
                ref = probe_port(c[probe_name])
                R.check(port_matches(ref, c) is not None,
                        f"{ctag}: {probe_name} port {ref!r} is not a declared containerPort")
        cmd = c.get("command") or []
        if len(cmd) >= 3 and os.path.basename(str(cmd[0])) in ("sh", "bash", "dash") and cmd[1] == "-c":
            check_shell_syntax(str(cmd[2]), f"{ctag}: inline script", shell="sh")

    for vname, v in volumes.items():
        vtag = f"{tag} volume {vname}"
        if "secret" in v:
            sname = v["secret"].get("secretName")
            if R.check(sname in secrets, f"{vtag}: Secret {sname!r} is defined nowhere under deploy/"):
                keys = set((secrets[sname].get("data") or {}).keys()) | set(
                    (secrets[sname].get("stringData") or {}).keys())
                for item in v["secret"].get("items") or []:
                    R.check(item.get("key") in keys, f"{vtag}: Secret {sname} has no key {item.get('key')!r}")
        if "configMap" in v:
            cname = v["configMap"].get("name")
            if R.check(cname in configmaps, f"{vtag}: ConfigMap {cname!r} is not defined"):
                data = configmaps[cname].get("data") or {}
                for item in v["configMap"].get("items") or []:
                    R.check(item.get("key") in data, f"{vtag}: ConfigMap {cname} has no key {item.get('key')!r}")
        if "persistentVolumeClaim" in v:
            R.fail(f"{vtag}: use volumeClaimTemplates, not a shared claim")
        R.check(any(m.get("name") == vname for c in containers(w) for m in c.get("volumeMounts") or []),
                f"{vtag}: defined but mounted by no container")


def mount_path(c, volume):
    for m in c.get("volumeMounts") or []:
        if m.get("name") == volume:
            return m.get("mountPath")
    return None


def secret_volume(w, c):
    """(secretName, mountPath) of the container's Secret volume."""
    for v in pod_spec(w).get("volumes") or []:
        if "secret" in v and mount_path(c, v["name"]):
            return v["secret"].get("secretName"), mount_path(c, v["name"])
    return None, None


def config_of(w, c, tomls):
    """TOML the container reads through --config, from its ConfigMap volume."""
    m = re.search(r"--config[ =](\S+)", command_text(c))
    if not m:
        return None
    path = m.group(1).strip("\"'")
    for v in pod_spec(w).get("volumes") or []:
        if "configMap" in v:
            mp = mount_path(c, v["name"])
            if mp and path.startswith(mp.rstrip("/") + "/"):
                rel = path[len(mp.rstrip("/")) + 1:]
                key = rel
                for item in v["configMap"].get("items") or []:
                    if item.get("path") == rel:
                        key = item.get("key")
                return tomls.get((v["configMap"].get("name"), key))
    return None


def check_tls_paths(tag, c, cfg, secret_name, secret_mount, prefix):
    text = command_text(c)
    if R.check(cfg is not None, f"{tag}: --config does not name a TOML file of a mounted ConfigMap"):
        ca = (cfg.get("tls") or {}).get("ca_file", "")
        R.check(ca == f"{secret_mount}/ca.pem",
                f"{tag}: tls.ca_file {ca!r} is not ca.pem in the Secret mount {secret_mount}")
    R.check(f"--tls.cert_file=\"{secret_mount}/{prefix}-$" in text
            and f"--tls.key_file=\"{secret_mount}/{prefix}-$" in text,
            f"{tag}: --tls.cert_file / --tls.key_file do not point at {secret_mount}/{prefix}-<index>")
    return secret_name


def check_statefulset(where, origin, sts, headless, tomls):
    name = sts["metadata"]["name"]
    tag = f"{where}: {origin} StatefulSet/{name}"
    spec = sts.get("spec") or {}
    svc_name = spec.get("serviceName")
    info = {"name": name, "service": svc_name, "replicas": spec.get("replicas", 1), "port": None}
    if R.check(svc_name in headless, f"{tag}: serviceName {svc_name!r} is not a headless Service"):
        svc = headless[svc_name]
        R.check(subset((svc.get("spec") or {}).get("selector") or {},
                       labels_of(spec.get("template") or {})),
                f"{tag}: Service {svc_name} selector does not select the shard pods")
    R.check(isinstance(info["replicas"], int) and info["replicas"] >= 1, f"{tag}: replicas must be >= 1")
    R.check(spec.get("podManagementPolicy") == "Parallel",
            f"{tag}: podManagementPolicy must be Parallel (shards wait for each other)")
    cs = [c for c in containers(sts, init=False) if "cohort-server" in command_text(c)]
    if not R.check(len(cs) == 1, f"{tag}: no container runs cohort-server"):
        return info
    c = cs[0]
    text = command_text(c)
    info["container"] = c
    for flag in ("--shard ", "--shards ", "--listen ", "--coordinator ", "--config ", "--name "):
        R.check(flag in text, f"{tag}: cohort-server is not given {flag.strip()}")
    R.check("HOSTNAME##*-" in text, f"{tag}: shard index is not derived from the hostname ordinal")
    R.check('--listen "tcp://0.0.0.0:$COHORT_PORT"' in text,
            f"{tag}: cohort-server must --listen on tcp://0.0.0.0:$COHORT_PORT (reachable from other pods)")
    R.check('--name "shard-$ordinal"' in text, f"{tag}: cohort-server is not given --name shard-<ordinal>")
    # Clients reach shards > 0 at the url the shard advertises; without it they get 0.0.0.0.
    R.check(re.search(r'--server\.advertise[= ]"tcp://\$\{?HOSTNAME\}?\.\$\{?COHORT_SERVICE\}?:\$\{?COHORT_PORT\}?"',
                      text) is not None,
            f"{tag}: cohort-server is not given --server.advertise=\"tcp://$HOSTNAME.$COHORT_SERVICE:$COHORT_PORT\"")
    check_flag_keys(tag, text, "server")
    R.check(str(info["replicas"]) == str(env_value(c, "COHORT_SHARDS")),
            f"{tag}: env COHORT_SHARDS={env_value(c, 'COHORT_SHARDS')} != replicas={info['replicas']}")
    R.check(env_value(c, "COHORT_SERVICE") in (None, svc_name),
            f"{tag}: env COHORT_SERVICE differs from serviceName {svc_name}")
    proto = port_matches("cohort", c)
    R.check(proto is not None, f"{tag}: no containerPort named cohort")
    if proto:
        info["port"] = proto.get("containerPort")
        R.check(info["port"] == PROTOCOL_PORT, f"{tag}: the cohort containerPort is {info['port']}, not {PROTOCOL_PORT}")
        R.check(str(env_value(c, "COHORT_PORT")) == str(info["port"]),
                f"{tag}: env COHORT_PORT differs from the cohort containerPort")
    check_metrics_port(tag, c, proto, spec)
    if svc_name in headless:
        for sp in (headless[svc_name].get("spec") or {}).get("ports") or []:
            target = port_matches(sp.get("targetPort", sp.get("port")), c)
            R.check(target is not None, f"{tag}: Service port {sp.get('name')} targets no containerPort")
            R.check(target is None or target is proto,
                    f"{tag}: Service port {sp.get('name')} is not the protocol port")
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe_name not in c:
            R.check(probe_name == "startupProbe", f"{tag}: {probe_name} missing")
            continue
        probe = c[probe_name]
        R.check(set(probe) & {"httpGet", "grpc", "exec"} == set() and "tcpSocket" in probe,
                f"{tag}: {probe_name} must be a tcpSocket probe (only shard 0 serves HTTP, and all shards "
                f"share the template)")
        R.check(proto is not None and port_matches(probe_port(probe), c) is proto,
                f"{tag}: {probe_name} is not on the protocol port {PROTOCOL_PORT}")
    cfg = config_of(sts, c, tomls)
    info["config"] = cfg
    flat = check_config_keys(tag, cfg, "server") if cfg is not None else {}
    secret_name, secret_mount = secret_volume(sts, c)
    info["secret"] = check_tls_paths(tag, c, cfg, secret_name, secret_mount, "shard")
    claims = [(t.get("metadata") or {}).get("name") for t in spec.get("volumeClaimTemplates") or []]
    if R.check(bool(claims), f"{tag}: no volumeClaimTemplates for checkpoints"):
        claim_mount = mount_path(c, claims[0])
        if R.check(claim_mount is not None, f"{tag}: claim template {claims[0]} is not mounted"):
            if cfg is not None:
                ckpt = flat.get("server.checkpoint_dir", "")
                R.check(under(ckpt, claim_mount),
                        f"{tag}: server.checkpoint_dir {ckpt!r} is not on the claim (mounted at {claim_mount})")
            # Shard 0 writes metrics.jsonl (default: relative, on the read-only root file system).
            mf = effective_flag(c, "server.metrics_file", flat, "metrics.jsonl")
            R.check(under(mf, claim_mount),
                    f"{tag}: server.metrics_file {mf!r} is not on the claim (mounted at {claim_mount})")
    return info


def check_metrics_port(tag, c, proto, spec):
    """The protocol port, and shard 0's HTTPS metrics port with its scrape annotations; no other."""
    http = port_matches("http", c)
    for p in c.get("ports") or []:
        R.check(p is proto or p is http, f"{tag}: containerPort {p.get('name')}/{p.get('containerPort')}: "
                                         f"cohort-server opens only {PROTOCOL_PORT} (cohort) and {HTTP_PORT} (http)")
    if R.check(http is not None, f"{tag}: no containerPort named http (shard 0's server.http, {HTTP_PORT})"):
        R.check(http.get("containerPort") == HTTP_PORT,
                f"{tag}: the http containerPort is {http.get('containerPort')}, not {HTTP_PORT}")
        R.check(str(env_value(c, "COHORT_HTTP_PORT")) == str(http.get("containerPort")),
                f"{tag}: env COHORT_HTTP_PORT differs from the http containerPort")
    text = command_text(c)
    # Bound to a non-loopback address, server.http serves HTTPS with the shard's certificate.
    R.check(re.search(r'--server\.http="0\.0\.0\.0:\$\{?COHORT_HTTP_PORT\}?"', text) is not None,
            f"{tag}: shard 0 is not given --server.http=\"0.0.0.0:$COHORT_HTTP_PORT\" (the default is loopback)")
    annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    scrape = {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}
    R.check(scrape == SCRAPE_ANNOTATIONS, f"{tag}: pod annotations prometheus.io/* are {scrape}, expected "
                                          f"{SCRAPE_ANNOTATIONS} (https: shard 0 serves its certificate)")


def under(path, mount):
    path, mount = str(path or ""), str(mount or "").rstrip("/")
    return bool(mount) and (path == mount or path.startswith(mount + "/"))


def effective_flag(c, key, flat, default):
    """Value of `key` for a container: its --key= flag (a literal or "$ENV"), else the TOML, else default."""
    m = re.search(r"--" + re.escape(key) + r'[= ]"?([^"\s]+)"?', command_text(c))
    if m:
        val = m.group(1)
        env = re.fullmatch(r"\$\{?(\w+)\}?", val)
        return env_value(c, env.group(1)) if env else val
    return flat.get(key, default)


def check_job(where, origin, job, sts_info, tomls):
    name = job["metadata"]["name"]
    tag = f"{where}: {origin} Job/{name}"
    spec = job.get("spec") or {}
    R.check(spec.get("completionMode") == "Indexed", f"{tag}: completionMode must be Indexed")
    completions = spec.get("completions")
    R.check(isinstance(completions, int) and completions >= 1, f"{tag}: completions must be >= 1")
    R.check(isinstance(spec.get("parallelism"), int) and spec["parallelism"] >= 1,
            f"{tag}: parallelism must be >= 1")
    R.check(pod_spec(job).get("restartPolicy") in ("Never", "OnFailure"),
            f"{tag}: restartPolicy must be Never or OnFailure")
    cs = [c for c in containers(job, init=False) if "cohort-client" in command_text(c)]
    if not R.check(len(cs) == 1, f"{tag}: no container runs cohort-client"):
        return
    c = cs[0]
    text = command_text(c)
    R.check("JOB_COMPLETION_INDEX" in text, f"{tag}: client index is not taken from JOB_COMPLETION_INDEX")
    m = re.search(r'(\w+)="?\$\{?JOB_COMPLETION_INDEX\b', text)
    index = m.group(1) if m else "JOB_COMPLETION_INDEX"
    var = r"\$\{?(?:" + re.escape(index) + r"|JOB_COMPLETION_INDEX)\}?"
    R.check(re.search(r'--name[= ]"client-' + var + '"', text) is not None,
            f"{tag}: cohort-client is not given --name client-<index>")
    # Without --part every client takes data.part's default 0/1: the whole data set, all alike.
    R.check(re.search(r'--part[= ]"' + var + r'/\$\{?COHORT_CLIENTS\}?"', text) is not None,
            f'{tag}: cohort-client is not given --part "${index}/$COHORT_CLIENTS" (its own part of the data)')
    for flag in ("--server ", "--data ", "--device ", "--config "):
        R.check(flag in text, f"{tag}: cohort-client is not given {flag.strip()}")
    R.check("--data.seed" not in text and "--data.part=" not in text,
            f"{tag}: data.seed / data.part must not be set per pod by flag (the seed must be equal on every client)")
    check_flag_keys(tag, text, "client")
    R.check(str(completions) == str(env_value(c, "COHORT_CLIENTS")),
            f"{tag}: env COHORT_CLIENTS={env_value(c, 'COHORT_CLIENTS')} != completions={completions}")
    server = env_value(c, "COHORT_SERVER") or ""
    if sts_info:
        want = f"tcp://{sts_info['name']}-0.{sts_info['service']}:{sts_info['port']}"
        R.check(server == want, f"{tag}: COHORT_SERVER={server!r}, expected the coordinator {want}")
        scfg = flatten(sts_info.get("config"))
        if isinstance(completions, int):
            for key in ("server.clients_per_round", "server.min_clients"):
                v = scfg.get(key, 10 if key.endswith("per_round") else 1)
                R.check(isinstance(v, int) and 1 <= v <= completions,
                        f"{tag}: {key} = {v} in the shards' config, but the Job runs {completions} clients")
            R.check(scfg.get("server.min_updates", 1) <= scfg.get("server.clients_per_round", 10),
                    f"{tag}: server.min_updates exceeds server.clients_per_round")
    cfg = config_of(job, c, tomls)
    if cfg is not None:
        flat = check_config_keys(tag, cfg, "client")
        R.check("data.part" not in flat, f"{tag}: data.part in the shared client config: every client would take the same part")
        ddir = flat.get("data.dir", DATASET_DIR)
        R.check(ddir == DATASET_DIR or any(under(ddir, m.get("mountPath")) for m in c.get("volumeMounts") or []),
                f"{tag}: data.dir {ddir!r} is neither the image's {DATASET_DIR} nor on a mounted volume")
    secret_name, secret_mount = secret_volume(job, c)
    check_tls_paths(tag, c, cfg, secret_name, secret_mount, "client")


# ----------------------------------------------------------------------------------------------
# Secrets: template keys match what the pods read


def check_secret_keys(secret_docs, by_kind, where):
    secrets = {s["metadata"]["name"]: s for _, s in secret_docs}
    for _, sts in by_kind.get("StatefulSet", []):
        c = containers(sts, init=False)[0]
        sname, _ = secret_volume(sts, c)
        want = {"ca.pem"} | {f"shard-{i}.{e}" for i in range(sts["spec"].get("replicas", 1)) for e in ("pem", "key")}
        if sname in secrets:
            have = set((secrets[sname].get("data") or {}).keys())
            R.check(have == want, f"{where}: Secret {sname} keys {sorted(have)} != {sorted(want)}")
    for _, job in by_kind.get("Job", []):
        c = containers(job, init=False)[0]
        sname, _ = secret_volume(job, c)
        want = {"ca.pem"} | {f"client-{i}.{e}" for i in range(job["spec"].get("completions", 1)) for e in ("pem", "key")}
        if sname in secrets:
            have = set((secrets[sname].get("data") or {}).keys())
            R.check(have == want, f"{where}: Secret {sname} keys {sorted(have)} != {sorted(want)}")
    for _, s in secret_docs:
        R.check("ca.key" not in (s.get("data") or {}), f"{where}: Secret {s['metadata']['name']} holds the CA key")


# ----------------------------------------------------------------------------------------------
# Kustomize


def check_kustomizations(docs, root):
    """Files named by each kustomization exist; patches name objects that exist. Returns dirs."""
    dirs = []
    objects = {(d.get("kind"), (d.get("metadata") or {}).get("name")) for _, _, d in docs}
    for path, _, d in docs:
        if d.get("kind") != "Kustomization":
            continue
        base = os.path.dirname(path)
        dirs.append(base)
        for res in d.get("resources") or []:
            R.check(os.path.exists(os.path.join(base, res)), f"{path}: resource {res} does not exist")
            R.check("template" not in res, f"{path}: resource {res} is a template, not a manifest")
        for p in d.get("patches") or []:
            ppath = os.path.join(base, p.get("path", "")) if isinstance(p, dict) and "path" in p else None
            if ppath and R.check(os.path.exists(ppath), f"{path}: patch {p['path']} does not exist"):
                with open(ppath, encoding="utf-8") as f:
                    for pd in yaml.safe_load_all(f):
                        key = (pd.get("kind"), (pd.get("metadata") or {}).get("name"))
                        R.check(key in objects, f"{ppath}: patches {key}, which no manifest defines")
    return dirs


def patch_files(docs):
    out = set()
    for path, _, d in docs:
        if d.get("kind") == "Kustomization":
            for p in d.get("patches") or []:
                if isinstance(p, dict) and "path" in p:
                    out.add(os.path.normpath(os.path.join(os.path.dirname(path), p["path"])))
    return out


def check_kustomize_builds(dirs, secret_docs):
    """Builds every kustomization; returns [(dir, objects)] of the builds that succeeded."""
    builds = []
    kubectl = shutil.which("kubectl")
    if not kubectl:
        R.note("skip: kubectl not found, kustomizations not built")
        return builds
    for d in dirs:
        r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=60)
        if not R.check(r.returncode == 0, f"kubectl kustomize {d} failed: {r.stderr.strip()}"):
            continue
        objs = [("build", o) for o in yaml.safe_load_all(r.stdout) if o]
        for problem in generic_checks.kubernetes_validate(kubernetes_validate_exe(), objs, f"kustomize {os.path.relpath(d)}"):
            R.fail(problem)
        check_objects(objs, f"kustomize {os.path.relpath(d)}", secret_pool=secret_docs)
        builds.append((d, objs))
        R.note(f"ok: kubectl kustomize {os.path.relpath(d)} builds {len(objs)} objects that pass the checks")
    return builds


# ----------------------------------------------------------------------------------------------
# Shell


def check_shell_syntax(text, what, shell="bash"):
    exe = shutil.which(shell) or shutil.which("bash")
    r = subprocess.run([exe, "-n"], input=text, capture_output=True, text=True, timeout=30)
    R.check(r.returncode == 0, f"{what}: `{shell} -n` fails: {r.stderr.strip()}")


def check_scripts(root):
    scripts = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        scripts += [os.path.join(dirpath, f) for f in filenames if f.endswith((".sh", ".sbatch"))]
    R.check(bool(scripts), f"{root}: no shell scripts found")
    shellcheck = shutil.which("shellcheck") if not R.quiet else None  # the mutation self-test skips it
    for s in sorted(scripts):
        with open(s, encoding="utf-8") as f:
            text = f.read()
        R.check(text.startswith("#!"), f"{s}: no shebang line")
        R.check(os.stat(s).st_mode & stat.S_IXUSR, f"{s}: not executable (chmod +x)")
        r = subprocess.run(["bash", "-n", s], capture_output=True, text=True, timeout=30)
        R.check(r.returncode == 0, f"{s}: bash -n fails: {r.stderr.strip()}")
        if shellcheck:
            r = subprocess.run([shellcheck, "-s", "bash", "-S", "error", s], capture_output=True, text=True, timeout=60)
            R.check(r.returncode == 0, f"{s}: shellcheck errors:\n{r.stdout}")
        if s.endswith(".sbatch"):
            check_sbatch_text(s, text)
    R.note(f"ok: {len(scripts)} shell scripts pass bash -n" + (" and shellcheck -S error" if shellcheck else ""))
    return scripts


def check_sbatch_text(path, text):
    lines = text.splitlines()
    first_cmd = next((i for i, l in enumerate(lines[1:], 1) if l.strip() and not l.startswith("#")), len(lines))
    sb = [i for i, l in enumerate(lines) if l.startswith("#SBATCH")]
    R.check(bool(sb), f"{path}: no #SBATCH directives")
    R.check(all(i < first_cmd for i in sb), f"{path}: #SBATCH lines after the first command are ignored by Slurm")
    for word in ("srun", "cohort-server", "cohort-client", "cohort-keygen", "--coordinator", "trap",
                 "--part", "--server.advertise", "--name"):
        R.check(word in text, f"{path}: does not mention {word}")
    blocks = {}
    for var, role in (("shard_cmd", "server"), ("client_cmd", "client")):
        m = re.search(var + r"='(.*?)'", text, re.S)
        if R.check(m is not None, f"{path}: no {var}='...' task command"):
            blocks[var] = m.group(1)
            check_flag_keys(f"{path} {var}", m.group(1), role)
    shard_cmd, client_cmd = blocks.get("shard_cmd", ""), blocks.get("client_cmd", "")
    R.check(re.search(r'--part "\$\{?j\}?/\$\{?COHORT_CLIENTS\}?"', client_cmd) is not None,
            f'{path}: client_cmd does not pass --part "$j/$COHORT_CLIENTS"')
    R.check('--name "client-$j"' in client_cmd, f'{path}: client_cmd does not pass --name "client-$j"')
    R.check('--name "shard-$i"' in shard_cmd, f'{path}: shard_cmd does not pass --name "shard-$i"')
    R.check(shard_cmd.count("--server.advertise=") >= 1 and "0.0.0.0" in shard_cmd,
            f"{path}: shard_cmd does not listen on 0.0.0.0 and pass --server.advertise")
    R.check("metrics_port" not in text.lower() and "METRICS_PORT" not in text,
            f"{path}: mentions a metrics port; cohort-server has none (wait on the protocol port)")
    R.check("mkdir -m 700" in text or "chmod 700" in text, f"{path}: certificate folder is not made mode 0700")


def check_no_key_material(root):
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                with open(p, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            n += 1
            R.check(not PEM_PRIVATE.search(text) and B64_PEM_ANY not in text,
                    f"{p}: holds PEM / base64 PEM material; never commit keys or generated Secrets")
    R.note(f"ok: no key material in {n} files")


# ----------------------------------------------------------------------------------------------
# make-secrets.sh, for real


def find_bin(root, name, env_name):
    """A built Cohort binary: $env_name, else PATH, else <repo>/build*/bin (build/ first)."""
    env = os.environ.get(env_name)
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which(name)
    if found:
        return found
    repo = os.path.dirname(os.path.abspath(root))
    for d in sorted(os.listdir(repo)) if os.path.isdir(repo) else []:
        cand = os.path.join(repo, d, "bin", name)
        if d.startswith("build") and os.access(cand, os.X_OK):
            return cand
    return None


def find_keygen(root):
    return find_bin(root, "cohort-keygen", "COHORT_KEYGEN")


def real_bins(root):
    """{"server": path, "client": path} of the built binaries, or None when either is missing."""
    server = find_bin(root, "cohort-server", "COHORT_SERVER_BIN")
    client = find_bin(root, "cohort-client", "COHORT_CLIENT_BIN")
    return {"server": server, "client": client} if server and client else None


def print_config(argv):
    """(returncode, effective config as a flat dict or None, stderr) of `argv --print-config`."""
    r = subprocess.run(list(argv) + ["--print-config"], capture_output=True, text=True, timeout=30)
    cfg = None
    if r.returncode == 0:
        try:
            cfg = flatten(tomllib.loads(r.stdout))
        except tomllib.TOMLDecodeError:
            cfg = None
    return r.returncode, cfg, r.stderr.strip()


def check_make_secrets(root, by_kind):
    script = os.path.join(root, "k8s", "make-secrets.sh")
    if not R.check(os.path.exists(script), f"{script} missing"):
        return
    keygen = find_keygen(root)
    kubectl = shutil.which("kubectl")
    if not keygen or not kubectl:
        R.note("skip: make-secrets.sh not run (needs cohort-keygen (COHORT_KEYGEN=...) and kubectl)")
        return
    stss = by_kind.get("StatefulSet", [])
    jobs = by_kind.get("Job", [])
    shards = stss[0][1]["spec"].get("replicas", 1) if stss else 2
    clients = jobs[0][1]["spec"].get("completions", 1) if jobs else 4
    with tempfile.TemporaryDirectory() as tmp:
        scratch = os.path.join(tmp, "scratch")
        os.mkdir(scratch)
        env = dict(os.environ, COHORT_KEYGEN=keygen, TMPDIR=scratch)
        out = os.path.join(tmp, "secrets.yaml")
        r = subprocess.run(["bash", script, "--shards", str(shards), "--clients", str(clients),
                            "--namespace", "cohort", "--out", out],
                           capture_output=True, text=True, env=env, timeout=120)
        if not R.check(r.returncode == 0, f"make-secrets.sh failed ({r.returncode}): {r.stderr.strip()}"):
            return
        printed = r.stdout + r.stderr
        R.check(not PEM_PRIVATE.search(printed) and B64_PEM_ANY not in printed and "BEGIN" not in printed,
                "make-secrets.sh printed key material")
        R.check(stat.S_IMODE(os.stat(out).st_mode) == 0o600, "make-secrets.sh output is not mode 0600")
        R.check(os.listdir(scratch) == [], f"make-secrets.sh left temporary files: {os.listdir(scratch)}")
        with open(out, encoding="utf-8") as f:
            docs = [("make-secrets", d) for d in yaml.safe_load_all(f) if d]
        R.check(len(docs) == 2 and all(d.get("kind") == "Secret" for _, d in docs),
                "make-secrets.sh did not write two Secrets")
        check_secret_keys(docs, by_kind, "make-secrets.sh output")
        for _, d in docs:
            R.check(d["metadata"].get("namespace") == "cohort", "make-secrets.sh Secret namespace is not cohort")
            R.check(labels_of(d).get("app.kubernetes.io/part-of") == "cohort", "make-secrets.sh Secret unlabeled")
            for key, val in (d.get("data") or {}).items():
                raw = base64.b64decode(val)
                want = b"PRIVATE KEY-----" if key.endswith(".key") else b"-----BEGIN CERTIFICATE-----"
                R.check(want in raw, f"make-secrets.sh Secret {d['metadata']['name']} key {key} is not a PEM {want!r}")
        r = subprocess.run(["bash", script, "--out", "-"], capture_output=True, text=True, env=env, timeout=60)
        R.check(r.returncode != 0, "make-secrets.sh accepted --out - (stdout)")
    R.note(f"ok: make-secrets.sh wrote Secrets for {shards} shards and {clients} clients, mode 0600, printed no keys")


# ----------------------------------------------------------------------------------------------
# cohort.sbatch under stub Slurm

FAKE_SRUN = r'''#!/usr/bin/python3
import json, os, signal, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    k, _, v = args.pop(0)[2:].partition("=")
    opts[k] = v
nodes = os.environ["FAKE_NODES"].split()
rel, nn, nt = int(opts.get("relative", 0)), int(opts["nodes"]), int(opts["ntasks"])
mine = nodes[rel:rel + nn]
assert len(mine) == nn, "srun: not enough nodes"
with open(os.environ["FAKE_LOG"] + "/srun.jsonl", "a") as f:
    f.write(json.dumps(opts) + "\n")
procs = []
for t in range(nt):
    if opts.get("distribution") == "cyclic":
        node, local = mine[t % nn], t // nn
    else:
        per = int(opts.get("ntasks-per-node") or -(-nt // nn))
        node, local = mine[t // per], t % per
    env = dict(os.environ, SLURM_PROCID=str(t), SLURM_LOCALID=str(local), SLURMD_NODENAME=node)
    procs.append(subprocess.Popen(args, env=env))
def forward(sig, _):
    for p in procs:
        try:
            p.send_signal(sig)
        except OSError:
            pass
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
sys.exit(max(p.wait() for p in procs))
'''

FAKE_SCONTROL = '''#!/bin/sh
[ "$1 $2" = "show hostnames" ] || exit 2
for n in $FAKE_NODES; do echo "$n"; done
'''

FAKE_NODE = r'''#!/bin/bash
# Records argv, the node, the certificate folder's state and the pid; then behaves as told.
role=$(basename "$0")
id="$role-$SLURM_PROCID"
printf '%s\n' "$@" >"$FAKE_LOG/$id.args"
cert=""
for a in "$@"; do case "$a" in --tls.cert_file=*) cert="${a#*=}" ;; esac; done
dir=$(dirname "$cert")
{
  echo "node=$SLURMD_NODENAME"
  echo "pid=$$"
  echo "dirmode=$(stat -c %a "$dir")"
  [ -r "$cert" ] && echo "cert=ok"
  [ -e "$dir/ca.key" ] && echo "cakey=present"
} >"$FAKE_LOG/$id.info"
# With the built binaries: would the real one accept this argv? (--print-config starts nothing.)
if [ -n "${FAKE_REAL_DIR:-}" ]; then
  "$FAKE_REAL_DIR/$role" "$@" --print-config >"$FAKE_LOG/$id.config" 2>"$FAKE_LOG/$id.config.err"
  echo "printrc=$?" >>"$FAKE_LOG/$id.info"
fi
if [ "$role" = cohort-server ]; then
  trap 'echo terminated >>"$FAKE_LOG/$id.info"; exit 0' TERM
  while :; do sleep 0.1; done
fi
exec sleep "${FAKE_CLIENT_SLEEP:-0.3}"
'''

FAKE_KEYGEN = r'''#!/bin/bash
# Stand-in for cohort-keygen when none is built: same files, dummy contents.
set -e
case "$1" in
  ca) out=$3; mkdir -p "$out"; echo cert >"$out/ca.pem"; echo key >"$out/ca.key" ;;
  node) shift; while [ $# -gt 0 ]; do case "$1" in --ca) ca=$2 ;; --name) n=$2 ;; --out) out=$2 ;; esac; shift 2; done
        [ -f "$ca/ca.key" ]; mkdir -p "$out"; echo cert >"$out/$n.pem"; echo key >"$out/$n.key"; chmod 600 "$out/$n.key" ;;
  *) exit 1 ;;
esac
echo "wrote files"
'''


def write_exe(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o755)


def read_kv(path):
    out = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                out.setdefault(k, v)
    return out


def read_args(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def flag(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def sbatch_env(tmp, bindir, log, nodes, extra):
    env = dict(os.environ)
    env.update({
        "PATH": bindir + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "fake[0-9]", "SLURM_SUBMIT_DIR": tmp,
        "SLURM_CPUS_ON_NODE": "8", "COHORT_BIN": bindir, "FAKE_NODES": " ".join(nodes),
        "FAKE_LOG": log, "COHORT_SHUTDOWN_GRACE": "1",
    })
    env.update(extra)
    return env


def check_sbatch_run(root):
    script = os.path.join(root, "slurm", "cohort.sbatch")
    if not R.check(os.path.exists(script), f"{script} missing"):
        return
    keygen = find_keygen(root)
    real = real_bins(root)
    with tempfile.TemporaryDirectory() as tmp:
        bindir, log = os.path.join(tmp, "bin"), os.path.join(tmp, "log")
        os.mkdir(bindir)
        os.mkdir(log)
        write_exe(os.path.join(bindir, "srun"), FAKE_SRUN)
        write_exe(os.path.join(bindir, "scontrol"), FAKE_SCONTROL)
        write_exe(os.path.join(bindir, "cohort-server"), FAKE_NODE)
        write_exe(os.path.join(bindir, "cohort-client"), FAKE_NODE)
        if keygen:
            os.symlink(os.path.abspath(keygen), os.path.join(bindir, "cohort-keygen"))
        else:
            write_exe(os.path.join(bindir, "cohort-keygen"), FAKE_KEYGEN)
        realdir = os.path.join(tmp, "real")
        if real:
            os.mkdir(realdir)
            for role in ("server", "client"):
                os.symlink(os.path.abspath(real[role]), os.path.join(realdir, f"cohort-{role}"))
        pki = os.path.join(tmp, ".cohort-pki-4242")

        # 1. A whole run: 3 shards on 2 nodes, 2 clients on each of 2 nodes; the readiness wait
        # polls the coordinator's protocol port, which this test listens on.
        nodes = ["n0", "n1", "n2", "n3"]
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(8)
        mport = lsock.getsockname()[1]
        env = sbatch_env(tmp, bindir, log, nodes, {
            "COHORT_SHARDS": "3", "COHORT_SHARD_NODES": "2", "COHORT_CLIENTS_PER_NODE": "2",
            "COHORT_COORDINATOR_HOST": "127.0.0.1", "COHORT_PORT": str(mport),
            "COHORT_READY_TIMEOUT": "20", "FAKE_REAL_DIR": realdir if real else ""})
        try:
            r = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=90, cwd=tmp)
        finally:
            lsock.close()
        if not R.check(r.returncode == 0, f"cohort.sbatch stub run failed ({r.returncode}):\n{r.stderr}"):
            return
        R.check(not os.path.exists(pki), "cohort.sbatch left its certificate folder behind")
        coord = f"tcp://127.0.0.1:{mport}"
        metrics = os.path.join(tmp, "cohort-metrics-4242.jsonl")
        real_checked = 0
        for i, (node, port) in enumerate([("n0", mport), ("n1", mport), ("n0", mport + 1)]):
            a = read_args(os.path.join(log, f"cohort-server-{i}.args"))
            info = read_kv(os.path.join(log, f"cohort-server-{i}.info"))
            tag = f"cohort.sbatch shard {i}"
            R.check(flag(a, "--shard") == str(i) and flag(a, "--shards") == "3", f"{tag}: --shard/--shards wrong: {a}")
            R.check(info.get("node") == node, f"{tag}: ran on {info.get('node')}, expected {node}")
            R.check(flag(a, "--listen") == f"tcp://0.0.0.0:{port}", f"{tag}: --listen {flag(a, '--listen')}")
            R.check(flag(a, "--name") == f"shard-{i}", f"{tag}: --name {flag(a, '--name')}")
            # Shard 0 advertises the coordinator's address, the others their node and port.
            want_adv = coord if i == 0 else f"tcp://{node}:{port}"
            R.check(flag(a, "--server.advertise") == want_adv,
                    f"{tag}: --server.advertise {flag(a, '--server.advertise')}, expected {want_adv}")
            R.check(flag(a, "--server.metrics_file") == metrics, f"{tag}: --server.metrics_file {flag(a, '--server.metrics_file')}")
            R.check(not any("metrics_port" in x for x in a), f"{tag}: passes a metrics port: {a}")
            check_flag_keys(tag, " ".join(a), "server")
            R.check(flag(a, "--coordinator") == (None if i == 0 else coord), f"{tag}: --coordinator {flag(a, '--coordinator')}")
            R.check(flag(a, "--tls.cert_file") == f"{pki}/shard-{i}.pem", f"{tag}: certificate {flag(a, '--tls.cert_file')}")
            R.check(flag(a, "--config") is not None, f"{tag}: no --config")
            R.check(os.path.isdir(flag(a, "--server.checkpoint_dir") or "/nonexistent"), f"{tag}: checkpoint folder missing")
            R.check(info.get("dirmode") == "700" and info.get("cert") == "ok", f"{tag}: certificate folder {info}")
            R.check("cakey" not in info, f"{tag}: the CA key was still in the certificate folder")
            R.check("terminated" in open(os.path.join(log, f"cohort-server-{i}.info")).read(),
                    f"{tag}: was not stopped with SIGTERM after the clients finished")
            if real:
                cfg = real_config(log, f"cohort-server-{i}", info, tag)
                if cfg is not None:
                    real_checked += 1
                    for key, want in (("server.shard", i), ("server.shards", 3), ("server.advertise", want_adv),
                                      ("server.name", f"shard-{i}"), ("server.clients_per_round", 4),
                                      ("server.min_clients", 4), ("tls.ca_file", f"{pki}/ca.pem")):
                        R.check(cfg.get(key) == want, f"{tag}: real cohort-server sees {key} = {cfg.get(key)!r}, expected {want!r}")
        for j, node in enumerate(["n2", "n2", "n3", "n3"]):
            a = read_args(os.path.join(log, f"cohort-client-{j}.args"))
            info = read_kv(os.path.join(log, f"cohort-client-{j}.info"))
            tag = f"cohort.sbatch client {j}"
            R.check(flag(a, "--name") == f"client-{j}", f"{tag}: --name {flag(a, '--name')}")
            R.check(flag(a, "--server") == coord, f"{tag}: --server {flag(a, '--server')}")
            R.check(flag(a, "--data") == "dirichlet:0.5" and flag(a, "--device") == "cpu", f"{tag}: --data/--device {a}")
            R.check(flag(a, "--part") == f"{j}/4", f"{tag}: --part {flag(a, '--part')}, expected {j}/4")
            check_flag_keys(tag, " ".join(a), "client")
            if real:
                cfg = real_config(log, f"cohort-client-{j}", info, tag)
                if cfg is not None:
                    real_checked += 1
                    for key, want in (("client.name", f"client-{j}"), ("client.server", coord), ("data.part", f"{j}/4"),
                                      ("data.partition", "dirichlet:0.5"), ("tls.ca_file", f"{pki}/ca.pem")):
                        R.check(cfg.get(key) == want, f"{tag}: real cohort-client sees {key} = {cfg.get(key)!r}, expected {want!r}")
            R.check(flag(a, "--tls.key_file") == f"{pki}/client-{j}.key", f"{tag}: key {flag(a, '--tls.key_file')}")
            R.check(info.get("node") == node, f"{tag}: ran on {info.get('node')}, expected {node}")
            R.check(info.get("dirmode") == "700" and info.get("cert") == "ok", f"{tag}: certificate folder {info}")
        R.check(not os.path.exists(os.path.join(log, "cohort-client-4.args")), "cohort.sbatch started too many clients")
        with open(os.path.join(log, "srun.jsonl"), encoding="utf-8") as f:
            steps = [json.loads(l) for l in f]
        R.check(len(steps) == 2 and steps[0].get("cpus-per-task") == "4" and steps[1].get("cpus-per-task") == "4",
                f"cohort.sbatch srun CPUs per task: {steps}")

        # 2. Too few nodes: refused before any key is made.
        shutil.rmtree(log)
        os.mkdir(log)
        # (One node is a valid layout, shards and clients sharing it: deploy_slurm runs it.)
        env = sbatch_env(tmp, bindir, log, ["n0", "n1"], {"COHORT_READY_TIMEOUT": "0", "COHORT_SHARD_NODES": "2"})
        r = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=30, cwd=tmp)
        R.check(r.returncode != 0 and "at least 3" in r.stderr, f"cohort.sbatch with no client node: {r.returncode} {r.stderr}")
        R.check(not os.path.exists(pki), "cohort.sbatch with no client node made a certificate folder")

        # 3. SIGTERM (scancel, time limit) while clients run: steps stopped, certificates removed.
        env = sbatch_env(tmp, bindir, log, ["n0", "n1"], {"COHORT_READY_TIMEOUT": "0", "FAKE_CLIENT_SLEEP": "60"})
        p = subprocess.Popen(["bash", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
        deadline = time.time() + 30
        want = [os.path.join(log, n) for n in ("cohort-client-0.info", "cohort-client-1.info", "cohort-server-0.info", "cohort-server-1.info")]
        while time.time() < deadline and not all(os.path.exists(w) and os.path.getsize(w) > 0 for w in want):
            time.sleep(0.1)
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            R.fail("cohort.sbatch did not exit within 30 s of SIGTERM")
        R.check(p.returncode != 0, "cohort.sbatch exited 0 after SIGTERM")
        R.check(not os.path.exists(pki), f"cohort.sbatch left its certificate folder after SIGTERM:\n{err}")
        time.sleep(0.5)
        for w in want:
            pid = int(read_kv(w).get("pid", "0") or 0)
            alive = False
            if pid:
                try:
                    os.kill(pid, 0)
                    alive = True
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            R.check(not alive, f"cohort.sbatch left {os.path.basename(w)[:-5]} running after SIGTERM")
    R.note("ok: cohort.sbatch under stub Slurm: placement, flags, 0700 certificates without CA key, clean-up on success and SIGTERM"
           + ("" if keygen else " (stub cohort-keygen)")
           + (f"; {real_checked} task argvs accepted by the real binaries" if real
              else "; skip: real binaries not built, argvs not fed to them"))


def real_config(log, name, info, tag):
    """The effective config the real binary printed for a stub task, or None (with a failure)."""
    err = ""
    if os.path.exists(os.path.join(log, f"{name}.config.err")):
        with open(os.path.join(log, f"{name}.config.err"), encoding="utf-8") as f:
            err = f.read().strip()
    if not R.check(info.get("printrc") == "0", f"{tag}: the real binary rejects the argv ({info.get('printrc')}): {err}"):
        return None
    with open(os.path.join(log, f"{name}.config"), encoding="utf-8") as f:
        return flatten(tomllib.loads(f.read()))


# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# The real binaries: --help's key lists, every pod's command under --print-config, a real round


HELP_KEY = re.compile(r"^  ([a-z_]+\.[a-z_]+) = ", re.M)
HELP_SECTION = re.compile(r"^  ([a-z_]+)\.\*  ", re.M)


def check_help_keys(real):
    for role, known, sections in (("server", SERVER_KEYS, SERVER_SECTIONS), ("client", CLIENT_KEYS, CLIENT_SECTIONS)):
        r = subprocess.run([real[role], "--help"], capture_output=True, text=True, timeout=30)
        if not R.check(r.returncode == 0, f"cohort-{role} --help failed ({r.returncode}): {r.stderr.strip()}"):
            continue
        keys, secs = set(HELP_KEY.findall(r.stdout)), set(HELP_SECTION.findall(r.stdout))
        R.check(keys == known, f"validate_manifests.py's {role.upper()}_KEYS differ from cohort-{role} --help: "
                               f"missing here {sorted(keys - known)}, gone from the binary {sorted(known - keys)}")
        R.check(secs == sections, f"plug-in sections of cohort-{role} --help {sorted(secs)} != {sorted(sections)}")
        for key in REMOVED_KEYS:
            R.check(key not in keys, f"cohort-{role} --help now lists {key}: update REMOVED_KEYS and the manifests")
    # The --print-config checks below only mean something if it rejects unknown keys.
    rc, _, err = print_config([real["server"], "--server.metrics_port=9100"])
    R.check(rc != 0 and "metrics_port" in err,
            f"cohort-server --server.metrics_port=9100 --print-config was accepted ({rc}): the contract checks have no teeth")
    rc, _, err = print_config([real["client"], "--server.rounds=3"])
    R.check(rc != 0 and "server.rounds" in err,
            f"cohort-client --server.rounds=3 --print-config was accepted ({rc}): the contract checks have no teeth")


def pod_sandbox(w, c, configmaps, tmp):
    """Maps the container's mount paths to folders under tmp, with its ConfigMap files written.
    Returns (mapping {mountPath: folder}, map(str) -> str, unmap(str) -> str)."""
    volumes = {v.get("name"): v for v in pod_spec(w).get("volumes") or []}
    mapping = {}
    for k, m in enumerate(c.get("volumeMounts") or []):
        d = os.path.join(tmp, f"mnt{k}")
        os.makedirs(d, exist_ok=True)
        mapping[m["mountPath"].rstrip("/")] = d
        v = volumes.get(m.get("name")) or {}
        if "configMap" in v:
            data = (configmaps.get(v["configMap"].get("name")) or {}).get("data") or {}
            items = v["configMap"].get("items") or [{"key": k2, "path": k2} for k2 in data]
            for item in items:
                dest = os.path.join(d, item["path"])
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "w", encoding="utf-8") as f:
                    f.write(data.get(item["key"], ""))
    # One pass each way, longest path first, so that /tmp does not rewrite an already mapped path.
    back = {d: mp for mp, d in mapping.items()}
    fwd_re = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(mp) for mp in sorted(mapping, key=len, reverse=True))
                        + r")(?![\w.-])") if mapping else None
    back_re = re.compile("|".join(re.escape(d) for d in sorted(back, key=len, reverse=True))) if back else None

    def map_(text):
        return fwd_re.sub(lambda m: mapping[m.group(1)], text) if fwd_re else text

    def unmap(text):
        return back_re.sub(lambda m: back[m.group(0)], text) if back_re else text
    return mapping, map_, unmap


def run_pod_command(w, c, configmaps, real_bin, role, env_extra, tmp):
    """Runs the container's `sh -c` script with cohort-<role> replaced by `real --print-config`.
    Returns (rc, flat effective config with the pod's paths, stderr, map)."""
    _, map_, unmap = pod_sandbox(w, c, configmaps, tmp)
    wrap = os.path.join(tmp, "wrap")
    os.makedirs(wrap, exist_ok=True)
    write_exe(os.path.join(wrap, f"cohort-{role}"),
              f'#!/bin/sh\nexec "{os.path.abspath(real_bin)}" "$@" --print-config\n')
    env = {"PATH": wrap + ":/usr/bin:/bin", "HOME": tmp, "LC_ALL": "C"}
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = map_(str(e["value"]))
    env.update(env_extra)
    cmd = [str(x) for x in c.get("command") or []]
    script = map_(cmd[2]) if len(cmd) >= 3 and cmd[1] == "-c" else None
    if script is None:
        return None, None, "not an sh -c command", map_
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=30, cwd=tmp)
    cfg = None
    if r.returncode == 0:
        try:
            cfg = {k: unmap(v) if isinstance(v, str) else v for k, v in flatten(tomllib.loads(r.stdout)).items()}
        except tomllib.TOMLDecodeError as e:
            return r.returncode, None, f"--print-config output does not parse: {e}", map_
    return r.returncode, cfg, r.stderr.strip(), map_


def check_contract(objs, where, real):
    """Every shard ordinal and client index, through the pod's own script, into the real binary."""
    by_kind = {}
    for _, o in objs:
        by_kind.setdefault(o.get("kind"), []).append(o)
    configmaps = {o["metadata"]["name"]: o for o in by_kind.get("ConfigMap", [])}
    stss, jobs = by_kind.get("StatefulSet", []), by_kind.get("Job", [])
    if not (stss and jobs):
        return
    sts, job = stss[0], jobs[0]
    sc = next((c for c in containers(sts, init=False) if "cohort-server" in command_text(c)), None)
    cc = next((c for c in containers(job, init=False) if "cohort-client" in command_text(c)), None)
    if sc is None or cc is None:
        return
    name, svc = sts["metadata"]["name"], sts["spec"].get("serviceName")
    port = (port_matches("cohort", sc) or {}).get("containerPort")
    replicas = sts["spec"].get("replicas", 1)
    coord = f"tcp://{name}-0.{svc}:{port}"
    claim = next(((t.get("metadata") or {}).get("name") for t in sts["spec"].get("volumeClaimTemplates") or []), None)
    claim_mount = mount_path(sc, claim) if claim else None
    _, secret_mount = secret_volume(sts, sc)
    for i in range(replicas):
        tag = f"{where}: shard {name}-{i} under the real cohort-server"
        with tempfile.TemporaryDirectory() as tmp:
            rc, cfg, err, map_ = run_pod_command(sts, sc, configmaps, real["server"], "server", {"HOSTNAME": f"{name}-{i}"}, tmp)
            if not R.check(rc == 0 and cfg is not None, f"{tag}: rejected ({rc}): {err}"):
                continue
            want = {"server.shard": i, "server.shards": replicas, "server.listen": f"tcp://0.0.0.0:{port}",
                    "server.name": f"shard-{i}", "server.advertise": f"tcp://{name}-{i}.{svc}:{port}",
                    "server.coordinator": "" if i == 0 else coord,
                    **({"server.http": f"0.0.0.0:{HTTP_PORT}"} if i == 0 else {}),
                    "tls.cert_file": f"{secret_mount}/shard-{i}.pem", "tls.ca_file": f"{secret_mount}/ca.pem"}
            for key, val in want.items():
                R.check(cfg.get(key) == val, f"{tag}: {key} = {cfg.get(key)!r}, expected {val!r}")
            R.check(cfg.get("tls.key_file") not in ("", None), f"{tag}: tls.key_file is not set")
            R.check(cfg.get("tls.insecure") is False, f"{tag}: tls.insecure is on")
            for key in ("server.checkpoint_dir", "server.metrics_file"):
                R.check(under(cfg.get(key), claim_mount), f"{tag}: {key} = {cfg.get(key)!r} is not on the claim {claim_mount}")
            if i == 0 and under(cfg.get("server.metrics_file"), claim_mount):
                check_metrics_rotation(tag, sts, sc, configmaps, real, name, map_(cfg["server.metrics_file"]), tmp)
    completions = job["spec"].get("completions", 1)
    device = env_value(cc, "COHORT_DEVICE")
    data = env_value(cc, "COHORT_DATA")
    _, csecret = secret_volume(job, cc)
    parts, seeds = set(), set()
    for j in range(completions):
        tag = f"{where}: client index {j} under the real cohort-client"
        with tempfile.TemporaryDirectory() as tmp:
            rc, cfg, err, _ = run_pod_command(job, cc, configmaps, real["client"], "client", {"JOB_COMPLETION_INDEX": str(j)}, tmp)
            if not R.check(rc == 0 and cfg is not None, f"{tag}: rejected ({rc}): {err}"):
                continue
            want = {"client.name": f"client-{j}", "client.server": coord, "data.part": f"{j}/{completions}",
                    "data.partition": data, "client.device": device,
                    "tls.cert_file": f"{csecret}/client-{j}.pem", "tls.ca_file": f"{csecret}/ca.pem"}
            for key, val in want.items():
                R.check(cfg.get(key) == val, f"{tag}: {key} = {cfg.get(key)!r}, expected {val!r}")
            R.check(cfg.get("tls.insecure") is False, f"{tag}: tls.insecure is on")
            parts.add(cfg.get("data.part"))
            seeds.add(cfg.get("data.seed"))
    R.check(len(parts) == completions, f"{where}: the {completions} clients do not take distinct parts: {sorted(map(str, parts))}")
    R.check(len(seeds) <= 1, f"{where}: the clients' data.seed differ ({sorted(map(str, seeds))}): the parts would overlap")
    R.note(f"ok: {where}: {replicas} shard and {completions} client commands accepted by the real binaries, as expected")


def check_metrics_rotation(tag, sts, sc, configmaps, real, name, metrics, tmp):
    """Shard 0's script keeps a metrics file with rounds (the server truncates it on start)."""
    folder = os.path.dirname(metrics)
    rounds = '{"event":"round","round":1}\n{"event":"done","rounds":1}\n'
    with open(metrics, "w", encoding="utf-8") as f:
        f.write(rounds)
    run_pod_command(sts, sc, configmaps, real["server"], "server", {"HOSTNAME": f"{name}-0"}, tmp)
    kept = [f for f in os.listdir(folder) if f != os.path.basename(metrics) and f.endswith(".jsonl")]
    R.check(not os.path.exists(metrics) and len(kept) == 1,
            f"{tag}: a restart does not move the previous metrics aside (found {sorted(os.listdir(folder))})")
    with open(metrics, "w", encoding="utf-8") as f:
        f.write('{"event":"done","rounds":1}\n')
    run_pod_command(sts, sc, configmaps, real["server"], "server", {"HOSTNAME": f"{name}-0"}, tmp)
    R.check(os.path.exists(metrics) and len([f for f in os.listdir(folder) if f.endswith(".jsonl")]) == 2,
            f"{tag}: a metrics file without rounds (a restart that only finished again) was kept: {sorted(os.listdir(folder))}")


def check_e2e(objs, real):
    """2 shards and the Job's clients run one real round on localhost from the ConfigMap's TOML."""
    by_kind = {}
    for _, o in objs:
        by_kind.setdefault(o.get("kind"), []).append(o)
    cms = by_kind.get("ConfigMap", [])
    jobs = by_kind.get("Job", [])
    if not cms or not jobs:
        return
    data = cms[0].get("data") or {}
    if "server.toml" not in data or "client.toml" not in data:
        R.fail("e2e: the ConfigMap has no server.toml / client.toml")
        return
    ccfg = flatten(tomllib.loads(data["client.toml"]))
    ddir = ccfg.get("data.dir", DATASET_DIR)
    if not os.path.isdir(ddir):
        R.note(f"skip: real round not run: {ddir} missing (apt-get install dataset-fashion-mnist)")
        return
    cc = next((c for c in containers(jobs[0], init=False) if "cohort-client" in command_text(c)), {})
    n = jobs[0]["spec"].get("completions", 1)
    spec = env_value(cc, "COHORT_DATA") or "iid"
    procs = []

    def start(argv, log):
        f = open(log, "w", encoding="utf-8")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        f.close()
        procs.append(p)
        return p

    def wait_all(ps, deadline):
        for p in ps:
            try:
                p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        return [p.returncode for p in ps]

    def tail(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-5:])

    with tempfile.TemporaryDirectory() as tmp:
        stoml, ctoml = os.path.join(tmp, "server.toml"), os.path.join(tmp, "client.toml")
        with open(stoml, "w", encoding="utf-8") as f:
            f.write(data["server.toml"])
        with open(ctoml, "w", encoding="utf-8") as f:
            f.write(data["client.toml"])
        metrics = os.path.join(tmp, "metrics.jsonl")
        fast = ["--insecure", "--server.rounds=1", "--train.steps=2", "--server.round_deadline_ms=60000"]

        def shards():
            pf = os.path.join(tmp, "port0")
            if os.path.exists(pf):
                os.unlink(pf)
            s0 = start([real["server"], "--shard", "0", "--shards", "2", "--listen", "tcp://127.0.0.1:*",
                        "--port-file", pf, "--name", "shard-0", "--config", stoml, *fast,
                        f"--server.checkpoint_dir={tmp}/ck0", f"--server.metrics_file={metrics}"],
                       os.path.join(tmp, "shard-0.log"))
            deadline = time.time() + 20
            while not os.path.exists(pf) and s0.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            if not os.path.exists(pf):
                return None, None
            with open(pf, encoding="utf-8") as f:
                coord = f"tcp://127.0.0.1:{f.read().strip()}"
            s1 = start([real["server"], "--shard", "1", "--shards", "2", "--listen", "tcp://127.0.0.1:*",
                        "--coordinator", coord, "--name", "shard-1", "--config", stoml, *fast,
                        f"--server.checkpoint_dir={tmp}/ck1"], os.path.join(tmp, "shard-1.log"))
            return [s0, s1], coord

        try:
            ss, coord = shards()
            if not R.check(ss is not None, f"e2e: shard 0 did not start:\n{tail(os.path.join(tmp, 'shard-0.log'))}"):
                return
            cs = [start([real["client"], "--server", coord, "--name", f"client-{j}", "--data", spec,
                         "--part", f"{j}/{n}", "--device", "cpu", "--insecure", "--config", ctoml],
                        os.path.join(tmp, f"client-{j}.log")) for j in range(n)]
            deadline = time.time() + 90
            crc, src = wait_all(cs, deadline), wait_all(ss, deadline)
            for j, rc in enumerate(crc):
                R.check(rc == 0, f"e2e: client-{j} exited {rc}:\n{tail(os.path.join(tmp, f'client-{j}.log'))}")
            for i, rc in enumerate(src):
                R.check(rc == 0, f"e2e: shard-{i} exited {rc}:\n{tail(os.path.join(tmp, f'shard-{i}.log'))}")
            with open(metrics, encoding="utf-8") as f:
                events = [json.loads(l).get("event") for l in f if l.strip()]
            R.check("round" in events and "done" in events, f"e2e: metrics.jsonl events {events}")
            # A StatefulSet restarts shards that exited 0: they resume from the final checkpoint
            # and finish again at once, with no client (README: "Restarts").
            ss, _ = shards()
            if R.check(ss is not None, "e2e: restarted shard 0 did not start"):
                src = wait_all(ss, time.time() + 30)
                R.check(src == [0, 0], f"e2e: restarted shards did not finish at once: exit {src}\n"
                                       f"{tail(os.path.join(tmp, 'shard-0.log'))}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    R.note(f"ok: a real round from the ConfigMap's TOML: 2 shards, {n} clients ({spec}, --part j/{n}) exit 0; "
           "restarted shards finish again at once")


# ----------------------------------------------------------------------------------------------
# Mutation self-test: each known mistake, applied alone to a copy, must fail the static checks.

MUTANTS = [
    # (what, file, text, replacement, a word the failure must contain)
    ("metrics_port key", "k8s/base/configmap.yaml", '    round_deadline_ms = 120000\n',
     '    round_deadline_ms = 120000\n    metrics_port = 9100\n', "metrics_port"),
    ("misspelt client key", "k8s/base/configmap.yaml", "    seed = 1   ", "    sed = 1    ", "data.sed"),
    ("misspelt train key", "k8s/base/configmap.yaml", '    optimizer = "sgd"', '    optimiser = "sgd"', "train.optimiser"),
    ("clients_per_round above the clients", "k8s/base/configmap.yaml", "clients_per_round = 4 ", "clients_per_round = 5 ",
     "clients_per_round"),
    ("client without --part", "k8s/base/job-clients.yaml", '                --part "$index/$COHORT_CLIENTS" \\\n', "", "--part"),
    ("every client the same part", "k8s/base/job-clients.yaml", '--part "$index/$COHORT_CLIENTS"', '--part "0/$COHORT_CLIENTS"',
     "--part"),
    ("per-pod data seed", "k8s/base/job-clients.yaml", '--part "$index/$COHORT_CLIENTS" \\',
     '--part "$index/$COHORT_CLIENTS" --data.seed="$index" \\', "data.seed"),
    ("client name without index", "k8s/base/job-clients.yaml", '--name "client-$index"', '--name "client"', "--name"),
    ("shard without advertise", "k8s/base/statefulset.yaml",
     '                --server.advertise="tcp://$HOSTNAME.$COHORT_SERVICE:$COHORT_PORT" \\\n', "", "advertise"),
    ("shard listening on localhost", "k8s/base/statefulset.yaml", '--listen "tcp://0.0.0.0:$COHORT_PORT"',
     '--listen "tcp://127.0.0.1:$COHORT_PORT"', "0.0.0.0"),
    ("metrics_port flag", "k8s/base/statefulset.yaml", '--server.metrics_file="$COHORT_METRICS_FILE"',
     '--server.metrics_port=9100', "metrics_port"),
    ("metrics file off the claim", "k8s/base/statefulset.yaml", "value: /var/lib/cohort/metrics.jsonl",
     "value: /tmp/metrics.jsonl", "metrics_file"),
    ("HTTP readiness probe", "k8s/base/statefulset.yaml", "          readinessProbe:\n            tcpSocket:\n              port: cohort",
     "          readinessProbe:\n            httpGet:\n              path: /metrics\n              port: cohort", "tcpSocket"),
    ("liveness probe removed", "k8s/base/statefulset.yaml",
     "          livenessProbe:\n            tcpSocket:\n              port: cohort\n            periodSeconds: 20\n", "          x-removed:\n", "livenessProbe"),
    ("protocol port moved", "k8s/base/statefulset.yaml", "              containerPort: 7000", "              containerPort: 7001", "7000"),
    ("metrics containerPort", "k8s/base/statefulset.yaml", "          ports:\n            - name: cohort\n",
     "          ports:\n            - name: metrics\n              containerPort: 9100\n            - name: cohort\n", "metrics"),
    ("scrape scheme http", "k8s/base/statefulset.yaml", "        prometheus.io/scheme: https ", "        prometheus.io/scheme: http  ",
     "prometheus"),
    ("scrape port differs", "k8s/base/statefulset.yaml", 'prometheus.io/port: "9100"', 'prometheus.io/port: "9101"',
     "prometheus"),
    ("metrics served on loopback", "k8s/base/statefulset.yaml", '--server.http="0.0.0.0:$COHORT_HTTP_PORT"',
     '--server.http="127.0.0.1:$COHORT_HTTP_PORT"', "server.http"),
    ("http containerPort moved", "k8s/base/statefulset.yaml", "              containerPort: 9100",
     "              containerPort: 9101", "9100"),
    ("metrics Service port", "k8s/base/service.yaml", "      protocol: TCP\n",
     "      protocol: TCP\n    - name: metrics\n      port: 9100\n      targetPort: 9100\n", "metrics"),
    ("metrics NetworkPolicy port", "k8s/base/networkpolicy.yaml", "        - port: cohort\n", "        - port: 9100\n", "metrics port"),
    ("metrics port from every namespace", "k8s/base/networkpolicy.yaml",
     "        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n",
     "        - namespaceSelector: {}\n", "metrics port"),
    ("YAML indentation", "k8s/base/service.yaml", "  clusterIP: None\n", "   clusterIP: None\n", "yamllint"),
    ("containerPort as a string", "k8s/base/statefulset.yaml", "              containerPort: 7000",
     '              containerPort: "7000"', "kubernetes-validate"),
    ("misspelt field", "k8s/base/statefulset.yaml", "imagePullPolicy:", "imagePulPolicy:", "kubernetes-validate"),
    ("dashboard names an unknown metric", "grafana/cohort-dashboard.json", '"cohort_train_loss"',
     '"cohort_training_loss"', "cohort_training_loss"),
    ("dashboard drops a family", "grafana/cohort-dashboard.json", '"expr": "cohort_round_comm_seconds"',
     '"expr": "cohort_round_train_seconds"', "cohort_round_comm_seconds"),
    ("sbatch client without --part", "slurm/cohort.sbatch", '--part "$j/$COHORT_CLIENTS" ', "", "--part"),
    ("sbatch metrics port", "slurm/cohort.sbatch", '--server.metrics_file="$COHORT_METRICS"', '--server.metrics_port=9100',
     "metrics_port"),
]


def kubernetes_validate_exe():
    return os.environ.get("COHORT_KUBERNETES_VALIDATE") or shutil.which("kubernetes-validate")


def generic_static_checks(root, files, objects):
    """yamllint, the Kubernetes API schemas, and the Grafana dashboard (deploy/generic_checks.py)."""
    problems = generic_checks.yamllint(shutil.which("yamllint"), os.path.join(root, ".yamllint"), files)
    problems += generic_checks.kubernetes_validate(kubernetes_validate_exe(), objects, "files")
    dashboards = sorted(os.path.join(root, "grafana", f) for f in os.listdir(os.path.join(root, "grafana"))
                        if f.endswith(".json")) if os.path.isdir(os.path.join(root, "grafana")) else []
    R.check(bool(dashboards), f"{root}/grafana: no dashboard JSON")
    promtool = shutil.which("promtool")
    for path in dashboards:
        problems += generic_checks.grafana_dashboard(path)
        if promtool:
            problems += generic_checks.promtool_check(promtool, path)
    if not promtool and not R.quiet:
        R.note("skip: promtool not found (Debian prometheus), dashboard PromQL not parsed by Prometheus")
    for p in problems:
        R.fail(p)
    R.note(f"ok: yamllint, kubernetes-validate --strict ({len(objects)} objects), "
           f"{len(dashboards)} Grafana dashboard(s)" if not problems else "generic checks found problems")


def static_checks(root):
    """The checks that need python3-yaml, sh, bash, yamllint and kubernetes-validate. Returns what
    later checks use."""
    files = yaml_files(root)
    R.check(bool(files), f"{root}: no YAML files")
    docs = load_docs(files)
    R.note(f"ok: {len(files)} YAML files, {len(docs)} documents parse")

    patches = patch_files(docs)
    k8s = [(os.path.relpath(p, root), d) for p, _, d in docs
           if d.get("kind") != "Kustomization" and os.path.normpath(p) not in patches]
    templates = [(o, d) for o, d in k8s if "templates" in o.split(os.sep)]
    manifests = [(o, d) for o, d in k8s if "templates" not in o.split(os.sep)]
    generic_static_checks(root, files, k8s)
    secret_docs = [(o, d) for o, d in k8s if d.get("kind") == "Secret"]
    for o, d in templates:
        if d.get("kind") == "Secret":
            for key, val in (d.get("data") or {}).items():
                R.check(isinstance(val, str) and val.startswith("<") and val.endswith(">"),
                        f"{o}: template Secret value for {key} is not a <placeholder>")
    by_kind = check_objects(manifests + templates, "files", secret_pool=secret_docs)
    check_secret_keys(secret_docs, by_kind, "Secret template")
    R.note(f"ok: structure of {len(manifests)} manifests and {len(templates)} templates checked")

    dirs = check_kustomizations(docs, root)
    check_no_key_material(root)
    check_scripts(root)
    return manifests, secret_docs, by_kind, dirs


def check_mutants(root):
    global R
    outer = R
    caught = 0
    for what, rel, old, new, word in MUTANTS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "deploy")
            shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
            path = os.path.join(copy, rel)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if not outer.check(text.count(old) == 1, f"mutant {what!r}: its text is not in {rel} exactly once; update MUTANTS"):
                continue
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(old, new))
            R = Report(quiet=True)
            try:
                static_checks(copy)
            finally:
                inner, R = R, outer
            hit = any(word in f for f in inner.failures)
            if os.environ.get("COHORT_MUTANTS_VERBOSE"):
                print(f"mutant {what!r}: " + "\n    ".join(inner.failures))
            caught += hit
            R.check(hit, f"mutant {what!r} ({rel}) passes the static checks; expected a failure mentioning {word!r}"
                         + (f"; it failed with: {inner.failures[:2]}" if inner.failures else ""))
    R.note(f"ok: mutation self-test: {caught} of {len(MUTANTS)} known mistakes caught")


# ----------------------------------------------------------------------------------------------


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = os.path.abspath(sys.argv[1])
    manifests, secret_docs, by_kind, dirs = static_checks(root)
    check_mutants(root)
    builds = check_kustomize_builds(dirs, secret_docs)
    real = real_bins(root)
    if real:
        check_help_keys(real)
        check_contract(manifests, "files", real)
        for d, objs in builds:
            check_contract(objs, f"kustomize {os.path.relpath(d)}", real)
        check_e2e(manifests, real)
    else:
        R.note("skip: cohort-server / cohort-client not built (COHORT_SERVER_BIN, COHORT_CLIENT_BIN): "
               "no --help, --print-config or real-round checks")
    check_make_secrets(root, by_kind)
    check_sbatch_run(root)

    if R.failures:
        print(f"\nFAILED: {len(R.failures)} of {len(R.failures) + R.passed} checks")
        for f in R.failures:
            print(f"  - {f}")
        return 1
    print(f"\nPASSED: {R.passed} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
