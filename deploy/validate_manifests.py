#!/usr/bin/python3
"""Checks Cohort's deployment files: Kubernetes manifests, the Secret generator and the Slurm script.

    /usr/bin/python3 deploy/validate_manifests.py deploy

Static checks (always run; need only python3-yaml):
  * every *.yaml / *.yml under the folder parses, all documents; objects carry apiVersion, kind,
    metadata.name (DNS-1123) and the app.kubernetes.io/part-of=cohort label; kustomizations name
    files that exist; patches target objects that exist;
  * the StatefulSet's serviceName is a headless Service (clusterIP: None) whose selector matches
    the pods; selectors match template labels; named ports exist;
  * every volumeMount has a volume or claim template; every Secret / ConfigMap a pod uses exists
    (the Secret template in k8s/templates) with the keys the pods read (shard-<i> for i < replicas,
    client-<i> for i < completions); ConfigMap items exist and their TOML parses;
  * shards: command runs cohort-server with --shard from the hostname ordinal, --shards, --listen,
    --coordinator, --config; COHORT_SHARDS = replicas; readiness and liveness probes on the metrics
    port = server.metrics_port; the checkpoint claim is mounted at server.checkpoint_dir; resources;
  * clients: Job with completionMode Indexed, command runs cohort-client with --name
    client-$JOB_COMPLETION_INDEX and --server pointing at <statefulset>-0.<service>:<port>;
  * containers: resources, non-root, no privilege escalation, capabilities dropped;
  * no file holds key material; inline `sh -c` scripts pass `sh -n`; every *.sh / *.sbatch has a
    shebang, is executable and passes `bash -n` (and `shellcheck -S error` when installed).
Functional checks (run when their tools are found, else reported as skipped):
  * `kubectl kustomize` builds every kustomization and the result passes the checks above;
  * k8s/make-secrets.sh with cohort-keygen + kubectl: Secrets with exactly the keys the pods read,
    file mode 0600, no key material on stdout/stderr, no temporary files left;
  * slurm/cohort.sbatch under stub srun/scontrol and stub cohort binaries: placement, flags,
    certificate folder mode 0700 without the CA key, clean-up after success and after SIGTERM.
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

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Built from pieces so that this file does not match itself.
PEM_PRIVATE = re.compile("-----BEGIN [A-Z ]*" + "PRIVATE KEY-----")
B64_PEM_ANY = "LS0tLS1" + "CRUdJTi"  # base64 of "-----BEGIN"
WORKLOADS = {"StatefulSet", "Deployment", "DaemonSet", "Job", "ReplicaSet"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition", "PriorityClass"}


class Report:
    def __init__(self):
        self.failures = []
        self.passed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failures.append(what)
        return cond

    def fail(self, what):
        self.failures.append(what)

    @staticmethod
    def note(what):
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
        R.check(bool(o.get("apiVersion")), f"{tag}: apiVersion missing")
        R.check(bool(o.get("kind")), f"{tag}: kind missing")
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
    for flag in ("--shard ", "--shards ", "--listen ", "--coordinator ", "--config "):
        R.check(flag in text, f"{tag}: cohort-server is not given {flag.strip()}")
    R.check("HOSTNAME##*-" in text, f"{tag}: shard index is not derived from the hostname ordinal")
    R.check(str(info["replicas"]) == str(env_value(c, "COHORT_SHARDS")),
            f"{tag}: env COHORT_SHARDS={env_value(c, 'COHORT_SHARDS')} != replicas={info['replicas']}")
    R.check(env_value(c, "COHORT_SERVICE") in (None, svc_name),
            f"{tag}: env COHORT_SERVICE differs from serviceName {svc_name}")
    proto = port_matches("cohort", c)
    R.check(proto is not None, f"{tag}: no containerPort named cohort")
    if proto:
        info["port"] = proto.get("containerPort")
        R.check(str(env_value(c, "COHORT_PORT")) == str(info["port"]),
                f"{tag}: env COHORT_PORT differs from the cohort containerPort")
    if svc_name in headless:
        for sp in (headless[svc_name].get("spec") or {}).get("ports") or []:
            R.check(port_matches(sp.get("targetPort", sp.get("port")), c) is not None,
                    f"{tag}: Service port {sp.get('name')} targets no containerPort")
    cfg = config_of(sts, c, tomls)
    secret_name, secret_mount = secret_volume(sts, c)
    info["secret"] = check_tls_paths(tag, c, cfg, secret_name, secret_mount, "shard")
    metrics = port_matches("metrics", c)
    if R.check(metrics is not None, f"{tag}: no containerPort named metrics"):
        for probe_name in ("readinessProbe", "livenessProbe"):
            if R.check(probe_name in c, f"{tag}: {probe_name} missing"):
                R.check(port_matches(probe_port(c[probe_name]), c) is metrics,
                        f"{tag}: {probe_name} is not on the metrics port")
        if cfg is not None:
            R.check((cfg.get("server") or {}).get("metrics_port") == metrics.get("containerPort"),
                    f"{tag}: server.metrics_port in the config != metrics containerPort")
    claims = [(t.get("metadata") or {}).get("name") for t in spec.get("volumeClaimTemplates") or []]
    if R.check(bool(claims), f"{tag}: no volumeClaimTemplates for checkpoints"):
        ckpt_mount = mount_path(c, claims[0])
        R.check(ckpt_mount is not None, f"{tag}: claim template {claims[0]} is not mounted")
        if cfg is not None:
            R.check((cfg.get("server") or {}).get("checkpoint_dir") == ckpt_mount,
                    f"{tag}: server.checkpoint_dir is not the claim's mountPath {ckpt_mount}")
    return info


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
    R.check('--name "client-$' in text, f"{tag}: cohort-client is not given --name client-<index>")
    for flag in ("--server ", "--data ", "--device ", "--config "):
        R.check(flag in text, f"{tag}: cohort-client is not given {flag.strip()}")
    R.check(str(completions) == str(env_value(c, "COHORT_CLIENTS")),
            f"{tag}: env COHORT_CLIENTS={env_value(c, 'COHORT_CLIENTS')} != completions={completions}")
    server = env_value(c, "COHORT_SERVER") or ""
    if sts_info:
        want = f"tcp://{sts_info['name']}-0.{sts_info['service']}:{sts_info['port']}"
        R.check(server == want, f"{tag}: COHORT_SERVER={server!r}, expected the coordinator {want}")
    secret_name, secret_mount = secret_volume(job, c)
    check_tls_paths(tag, c, config_of(job, c, tomls), secret_name, secret_mount, "client")


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
    kubectl = shutil.which("kubectl")
    if not kubectl:
        R.note("skip: kubectl not found, kustomizations not built")
        return
    for d in dirs:
        r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=60)
        if not R.check(r.returncode == 0, f"kubectl kustomize {d} failed: {r.stderr.strip()}"):
            continue
        objs = [("build", o) for o in yaml.safe_load_all(r.stdout) if o]
        check_objects(objs, f"kustomize {os.path.relpath(d)}", secret_pool=secret_docs)
        R.note(f"ok: kubectl kustomize {os.path.relpath(d)} builds {len(objs)} objects that pass the checks")


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
    shellcheck = shutil.which("shellcheck")
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
    for word in ("srun", "cohort-server", "cohort-client", "cohort-keygen", "--coordinator", "trap"):
        R.check(word in text, f"{path}: does not mention {word}")
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


def find_keygen(root):
    env = os.environ.get("COHORT_KEYGEN")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("cohort-keygen")
    if found:
        return found
    repo = os.path.dirname(os.path.abspath(root))
    for d in sorted(os.listdir(repo)) if os.path.isdir(repo) else []:
        cand = os.path.join(repo, d, "bin", "cohort-keygen")
        if d.startswith("build") and os.access(cand, os.X_OK):
            return cand
    return None


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
        pki = os.path.join(tmp, ".cohort-pki-4242")

        # 1. A whole run: 3 shards on 2 nodes, 2 clients on each of 2 nodes; the readiness wait
        # polls a port this test listens on.
        nodes = ["n0", "n1", "n2", "n3"]
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(8)
        mport = lsock.getsockname()[1]
        env = sbatch_env(tmp, bindir, log, nodes, {
            "COHORT_SHARDS": "3", "COHORT_SHARD_NODES": "2", "COHORT_CLIENTS_PER_NODE": "2",
            "COHORT_COORDINATOR_HOST": "127.0.0.1", "COHORT_METRICS_PORT": str(mport),
            "COHORT_READY_TIMEOUT": "20"})
        try:
            r = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=90, cwd=tmp)
        finally:
            lsock.close()
        if not R.check(r.returncode == 0, f"cohort.sbatch stub run failed ({r.returncode}):\n{r.stderr}"):
            return
        R.check(not os.path.exists(pki), "cohort.sbatch left its certificate folder behind")
        coord = "tcp://127.0.0.1:7000"
        for i, (node, port, mp) in enumerate([("n0", 7000, mport), ("n1", 7000, mport), ("n0", 7001, mport + 1)]):
            a = read_args(os.path.join(log, f"cohort-server-{i}.args"))
            info = read_kv(os.path.join(log, f"cohort-server-{i}.info"))
            tag = f"cohort.sbatch shard {i}"
            R.check(flag(a, "--shard") == str(i) and flag(a, "--shards") == "3", f"{tag}: --shard/--shards wrong: {a}")
            R.check(info.get("node") == node, f"{tag}: ran on {info.get('node')}, expected {node}")
            R.check(flag(a, "--listen") == f"tcp://0.0.0.0:{port}", f"{tag}: --listen {flag(a, '--listen')}")
            R.check(flag(a, "--server.metrics_port") == str(mp), f"{tag}: metrics port {flag(a, '--server.metrics_port')}")
            R.check(flag(a, "--coordinator") == (None if i == 0 else coord), f"{tag}: --coordinator {flag(a, '--coordinator')}")
            R.check(flag(a, "--tls.cert_file") == f"{pki}/shard-{i}.pem", f"{tag}: certificate {flag(a, '--tls.cert_file')}")
            R.check(flag(a, "--config") is not None, f"{tag}: no --config")
            R.check(os.path.isdir(flag(a, "--server.checkpoint_dir") or "/nonexistent"), f"{tag}: checkpoint folder missing")
            R.check(info.get("dirmode") == "700" and info.get("cert") == "ok", f"{tag}: certificate folder {info}")
            R.check("cakey" not in info, f"{tag}: the CA key was still in the certificate folder")
            R.check("terminated" in open(os.path.join(log, f"cohort-server-{i}.info")).read(),
                    f"{tag}: was not stopped with SIGTERM after the clients finished")
        for j, node in enumerate(["n2", "n2", "n3", "n3"]):
            a = read_args(os.path.join(log, f"cohort-client-{j}.args"))
            info = read_kv(os.path.join(log, f"cohort-client-{j}.info"))
            tag = f"cohort.sbatch client {j}"
            R.check(flag(a, "--name") == f"client-{j}", f"{tag}: --name {flag(a, '--name')}")
            R.check(flag(a, "--server") == coord, f"{tag}: --server {flag(a, '--server')}")
            R.check(flag(a, "--data") == "dirichlet:0.5" and flag(a, "--device") == "cpu", f"{tag}: --data/--device {a}")
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
        env = sbatch_env(tmp, bindir, log, ["n0"], {"COHORT_READY_TIMEOUT": "0"})
        r = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=30, cwd=tmp)
        R.check(r.returncode != 0 and "at least 2" in r.stderr, f"cohort.sbatch with one node: {r.returncode} {r.stderr}")
        R.check(not os.path.exists(pki), "cohort.sbatch with one node made a certificate folder")

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
           + ("" if keygen else " (stub cohort-keygen)"))


# ----------------------------------------------------------------------------------------------


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = os.path.abspath(sys.argv[1])
    files = yaml_files(root)
    R.check(bool(files), f"{root}: no YAML files")
    docs = load_docs(files)
    R.note(f"ok: {len(files)} YAML files, {len(docs)} documents parse")

    patches = patch_files(docs)
    k8s = [(os.path.relpath(p, root), d) for p, _, d in docs
           if d.get("kind") != "Kustomization" and os.path.normpath(p) not in patches]
    templates = [(o, d) for o, d in k8s if "templates" in o.split(os.sep)]
    manifests = [(o, d) for o, d in k8s if "templates" not in o.split(os.sep)]
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
    check_kustomize_builds(dirs, secret_docs)
    check_no_key_material(root)
    check_scripts(root)
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
