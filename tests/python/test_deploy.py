"""The container image and the Kubernetes manifests in deploy/ hold together.

- Every manifest in deploy/k8s parses, and its objects fit each other: the
  ports each container declares are the ones its flags listen on, probes and
  Services point at declared ports, the workers dial the coordinator's
  Service, every container has resource requests and limits. Where kubectl
  is on the PATH it takes them too (`kubectl apply --dry-run=client`).
- The Dockerfile's build steps are the README's build commands.
- Every daemon flag the manifests use exists in that daemon's --help, asked
  through the image's entry point (deploy/entrypoint.sh).
- The image installs the daemons' Debian package from its build stage, whose
  dependencies bring the shared libraries.
"""

import http.server
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import pytest
import yaml

from conftest import REPO, Daemon, make_certs, short_temp_dir

K8S = REPO / "deploy" / "k8s"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
ENTRYPOINT = REPO / "deploy" / "entrypoint.sh"
README = REPO / "README.md"
NAMESPACE = "chorus"
COORDINATOR_SERVICE = "chorus-coordinator"
# The first argument of each daemon's container (the entry point's program).
COORDINATOR, WORKER = "coordinator", "worker"
# The command of the etcd members' container (etcd's own image).
ETCD = "etcd"

# Where each kind is served: (API group, version, resource, namespaced). A
# manifest of another kind fails test_manifests_kinds_known_are_served;
# add the kind here then.
KINDS: Dict[str, Tuple[str, str, str, bool]] = {
    "Namespace": ("", "v1", "namespaces", False),
    "Service": ("", "v1", "services", True),
    "Secret": ("", "v1", "secrets", True),
    "ConfigMap": ("", "v1", "configmaps", True),
    "ServiceAccount": ("", "v1", "serviceaccounts", True),
    "Deployment": ("apps", "v1", "deployments", True),
    "StatefulSet": ("apps", "v1", "statefulsets", True),
    "DaemonSet": ("apps", "v1", "daemonsets", True),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies", True),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets", True),
}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")

# Flags whose value is an address or port a container listens on.
ADDRESS_FLAGS = ("listen", "metrics_listen")
PORT_FLAGS = ("call_port", "data_port")

Manifest = Dict[str, Any]


def load_manifests() -> List[Manifest]:
    """Returns every object of every YAML file in deploy/k8s, in file order."""
    files = sorted(K8S.glob("*.yaml"))
    assert files, f"no manifests in {K8S}"
    objects = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for document in yaml.safe_load_all(f):
                if document is not None:
                    document["_file"] = path.name
                    objects.append(document)
    return objects


@pytest.fixture(scope="module")
def manifests() -> List[Manifest]:
    """The objects of deploy/k8s."""
    return load_manifests()


def of_kind(manifests: List[Manifest], kind: str) -> List[Manifest]:
    """The objects of one kind."""
    return [m for m in manifests if m["kind"] == kind]


def workloads(manifests: List[Manifest]) -> List[Manifest]:
    """The Deployments, StatefulSets and DaemonSets."""
    return [m for m in manifests if m["kind"] in WORKLOADS]


def containers(workload: Manifest) -> List[Dict[str, Any]]:
    """The containers of a workload's pod template."""
    return workload["spec"]["template"]["spec"]["containers"]


def workload_running(manifests: List[Manifest],
                     program: str) -> Tuple[Manifest, Dict[str, Any]]:
    """The one workload and container whose args start with `program`."""
    found = [(w, c) for w in workloads(manifests) for c in containers(w)
             if c.get("args", [None])[0] == program]
    assert len(found) == 1, (
        f"expected one container running {program}, found {len(found)}")
    return found[0]


def flags_of(args: List[str]) -> Dict[str, str]:
    """--name=value arguments as {name: value} (a bare --name gives "")."""
    flags = {}
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            flags[name] = value
    return flags


def port_of(address: str) -> int:
    """The port of host:port (the host may be [v6])."""
    return int(address.rsplit(":", 1)[1])


def listened_ports(flags: Dict[str, str]) -> Set[int]:
    """The ports the flags make a daemon listen on (0 and -1 excluded)."""
    ports = {port_of(flags[f]) for f in ADDRESS_FLAGS if flags.get(f)}
    ports |= {int(flags[f]) for f in PORT_FLAGS if f in flags}
    return {p for p in ports if p > 0}


def declared_ports(container: Dict[str, Any]) -> Dict[str, int]:
    """The container's ports, {name: number}."""
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def resolve_port(container: Dict[str, Any], port: Any) -> Optional[int]:
    """The number of a port given by name or number, if the container
    declares it; None otherwise.
    """
    declared = declared_ports(container)
    if isinstance(port, str):
        return declared.get(port)
    return port if port in declared.values() else None


def probes(container: Dict[str, Any]) -> Iterator[Tuple[str, Dict]]:
    """(kind, probe) for each probe the container has."""
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            yield kind, container[kind]


def selects(selector: Dict[str, str], workload: Manifest) -> bool:
    """Whether a label selector matches the workload's pods."""
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


def test_manifests_kinds_known_are_served(manifests: List[Manifest]) -> None:
    """Each object names a known kind at its API version, a name, and the
    namespace exactly when the kind is namespaced.
    """
    for m in manifests:
        where = f"{m['_file']}: {m.get('kind')} {m.get('metadata')}"
        assert m.get("kind") in KINDS, f"{where}: unknown kind"
        group, version, _, namespaced = KINDS[m["kind"]]
        expected = f"{group}/{version}" if group else version
        assert m.get("apiVersion") == expected, where
        assert m["metadata"].get("name"), where
        if namespaced:
            assert m["metadata"].get("namespace") == NAMESPACE, where
        else:
            assert "namespace" not in m["metadata"], where
    kinds = {m["kind"] for m in manifests}
    assert {"Namespace", "Service", "StatefulSet"} <= kinds
    assert kinds & {"StatefulSet", "DaemonSet"}, "no workers"
    assert [m["metadata"]["name"] for m in of_kind(manifests, "Namespace")
            ] == [NAMESPACE]
    # kubectl applies files in name order: the namespace must come first.
    assert manifests[0]["kind"] == "Namespace"


def named(manifests: List[Manifest], kind: str, name: str) -> Manifest:
    """The one object of `kind` called `name`."""
    [found] = [m for m in of_kind(manifests, kind)
               if m["metadata"]["name"] == name]
    return found


def replica_hosts(manifests: List[Manifest], workload: Manifest) -> List[str]:
    """The DNS names of a StatefulSet's pods on its headless Service:
    NAME-i.SERVICE.NAMESPACE.svc.cluster.local for each replica i.
    """
    name = workload["metadata"]["name"]
    service = workload["spec"]["serviceName"]
    return [f"{name}-{i}.{service}.{NAMESPACE}.svc.cluster.local"
            for i in range(workload["spec"]["replicas"])]


def etcd_workload(manifests: List[Manifest]) -> Tuple[Manifest, Dict]:
    """The one workload and container running etcd."""
    found = [(w, c) for w in workloads(manifests) for c in containers(w)
             if c.get("command", [None])[0] == ETCD]
    assert len(found) == 1, f"expected one etcd container, found {found}"
    return found[0]


def test_manifests_coordinators_replicated_on_etcd(
        manifests: List[Manifest]) -> None:
    """Three coordinators in a StatefulSet elect a leader on a three-member
    etcd StatefulSet: their --etcd names every member's client port, each
    advertises its own name on the headless Service (published before it is
    ready, so a standby can name the leader), etcd's --initial-cluster names
    every member, and disruption budgets take one pod of each at a time.
    """
    coordinator, container = workload_running(manifests, COORDINATOR)
    assert coordinator["kind"] == "StatefulSet"
    assert coordinator["spec"]["replicas"] == 3
    flags = flags_of(container["args"])
    etcd, etcd_container = etcd_workload(manifests)
    assert etcd["kind"] == "StatefulSet" and etcd["spec"]["replicas"] == 3
    client_port = declared_ports(etcd_container)["client"]
    peer_port = declared_ports(etcd_container)["peer"]
    assert flags["etcd"].split(",") == [
        f"https://{host}:{client_port}"
        for host in replica_hosts(manifests, etcd)]
    etcd_flags = flags_of(etcd_container["args"])
    assert etcd_flags["initial-cluster"].split(",") == [
        f"{host.split('.')[0]}=https://{host}:{peer_port}"
        for host in replica_hosts(manifests, etcd)]
    assert etcd_flags["client-cert-auth"] == "true"
    assert {"etcd_ca", "etcd_cert", "etcd_key"} <= set(flags)
    service = coordinator["spec"]["serviceName"]
    assert flags["advertise"] == (
        f"$(POD_NAME).{service}.{NAMESPACE}.svc.cluster.local:"
        f"{port_of(flags['listen'])}")
    for workload in (coordinator, etcd):
        headless = named(manifests, "Service",
                         workload["spec"]["serviceName"])
        assert headless["spec"].get("publishNotReadyAddresses") is True
        [budget] = [b for b in of_kind(manifests, "PodDisruptionBudget")
                    if selects(b["spec"]["selector"]["matchLabels"],
                               workload)]
        assert budget["spec"]["maxUnavailable"] == 1
    worker, _ = workload_running(manifests, WORKER)
    assert worker["kind"] in ("StatefulSet", "DaemonSet")


def test_manifests_container_ports_match_flags(
        manifests: List[Manifest]) -> None:
    """Each daemon's container declares exactly the ports its flags listen
    on, each with a name, and listens on every interface.
    """
    for program in (COORDINATOR, WORKER):
        _, container = workload_running(manifests, program)
        flags = flags_of(container["args"])
        ports = container.get("ports", [])
        assert all(p.get("name") for p in ports), ports
        assert {p["containerPort"] for p in ports} == listened_ports(
            flags), f"{program}: ports {ports} but flags {flags}"
        for flag in ADDRESS_FLAGS:
            if flags.get(flag):
                assert flags[flag].startswith("0.0.0.0:"), (program, flag)


def test_manifests_probe_ports_are_declared(
        manifests: List[Manifest]) -> None:
    """Every container has readiness and liveness probes; TCP, gRPC and HTTP
    probes use declared ports, and a chorusctl probe dials the daemon's own
    --listen port.
    """
    for workload in workloads(manifests):
        for container in containers(workload):
            kinds = {kind for kind, _ in probes(container)}
            assert {"readinessProbe", "livenessProbe"} <= kinds, (
                container["name"])
            listen = flags_of(container["args"]).get("listen")
            for kind, probe in probes(container):
                where = f"{container['name']} {kind}"
                for handler in ("tcpSocket", "grpc", "httpGet"):
                    if handler in probe:
                        assert resolve_port(
                            container, probe[handler]["port"]), where
                if "exec" in probe:
                    command = probe["exec"]["command"]
                    if command[0] == "chorusctl":
                        target = flags_of(command)["coordinator"]
                        assert target == f"127.0.0.1:{port_of(listen)}", (
                            where)


def test_manifests_services_target_declared_ports(
        manifests: List[Manifest]) -> None:
    """Every Service selects one workload, its named ports target ports that
    workload's container declares, and a StatefulSet's serviceName is a
    headless Service that selects it.
    """
    for service in of_kind(manifests, "Service"):
        selector = service["spec"]["selector"]
        selected = [w for w in workloads(manifests) if selects(selector, w)]
        assert len(selected) == 1, service["metadata"]["name"]
        container = containers(selected[0])[0]
        for port in service["spec"]["ports"]:
            assert port.get("name"), port
            target = port.get("targetPort", port["port"])
            assert resolve_port(container, target) == port["port"], port
    for workload in of_kind(manifests, "StatefulSet"):
        name = workload["spec"]["serviceName"]
        [service] = [s for s in of_kind(manifests, "Service")
                     if s["metadata"]["name"] == name]
        assert service["spec"].get("clusterIP") == "None"
        assert selects(service["spec"]["selector"], workload)
        assert selects(workload["spec"]["selector"]["matchLabels"], workload)


def test_manifests_worker_coordinator_address_is_the_service(
        manifests: List[Manifest]) -> None:
    """The workers' --coordinator lists every coordinator replica by its
    name on the headless Service, at the Service port that reaches the
    coordinator's --listen port; the ClusterIP Service for clients selects
    the coordinators too.
    """
    _, worker = workload_running(manifests, WORKER)
    targets = flags_of(worker["args"])["coordinator"].split(",")
    coordinator_workload, coordinator = workload_running(manifests,
                                                         COORDINATOR)
    listen = port_of(flags_of(coordinator["args"])["listen"])
    headless = named(manifests, "Service",
                     coordinator_workload["spec"]["serviceName"])
    [service_port] = [p for p in headless["spec"]["ports"]
                      if resolve_port(coordinator, p["targetPort"]) ==
                      listen]
    assert targets == [
        f"{host}:{service_port['port']}"
        for host in replica_hosts(manifests, coordinator_workload)]
    service = named(manifests, "Service", COORDINATOR_SERVICE)
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert selects(service["spec"]["selector"], coordinator_workload)


def test_manifests_worker_advertises_its_pod_ip(
        manifests: List[Manifest]) -> None:
    """Every $(VAR) in a container's args is an env variable it defines,
    and the worker advertises the pod IP from the downward API.
    """
    for workload in workloads(manifests):
        for container in containers(workload):
            env = {e["name"]: e for e in container.get("env", [])}
            for arg in container["args"]:
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    assert var in env, f"{container['name']}: {arg}"
    _, worker = workload_running(manifests, WORKER)
    advertise = flags_of(worker["args"])["advertise_address"]
    var = re.fullmatch(r"\$\((\w+)\)", advertise).group(1)
    [entry] = [e for e in worker["env"] if e["name"] == var]
    assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_manifests_resources_set_requests_and_limits(
        manifests: List[Manifest]) -> None:
    """Every container requests and limits CPU and memory."""
    for workload in workloads(manifests):
        for container in containers(workload):
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part, {})), (
                    f"{container['name']}: {part}")


def test_manifests_paths_in_flags_are_mounted(
        manifests: List[Manifest]) -> None:
    """Every file a daemon's flags or probes name lies under one of its
    volume mounts (the root file system is read-only), and every mount
    names a volume of its pod; the containers run as a non-root user.
    """
    path_flags = ("tls_dir", "tls_ca", "tls_cert", "tls_key",
                  "local_socket", "port_file", "metrics_port_file",
                  "etcd_ca", "etcd_cert", "etcd_key", "data-dir",
                  "trusted-ca-file", "cert-file", "key-file",
                  "peer-trusted-ca-file", "peer-cert-file", "peer-key-file")
    for workload in workloads(manifests):
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        volumes |= {c["metadata"]["name"] for c in
                    workload["spec"].get("volumeClaimTemplates", [])}
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in containers(workload):
            mounts = container.get("volumeMounts", [])
            assert {m["name"] for m in mounts} <= volumes
            assert container["securityContext"]["readOnlyRootFilesystem"]
            words = list(container["args"])
            for _, probe in probes(container):
                words += probe.get("exec", {}).get("command", [])
            for name, value in flags_of(words).items():
                if name in path_flags and value:
                    assert any(value.startswith(m["mountPath"] + "/") or
                               value == m["mountPath"] for m in mounts), (
                        f"{container['name']}: --{name}={value}")


class FakeApiServer(http.server.ThreadingHTTPServer):
    """Just enough of a Kubernetes API server for kubectl's client-side dry
    run: API discovery for the kinds in KINDS, and NotFound for every
    object (so that kubectl would create each).
    """

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FakeApiHandler)
        groups: Dict[str, List[Dict[str, Any]]] = {}
        for kind, (group, version, resource, namespaced) in KINDS.items():
            groups.setdefault(f"{group}/{version}" if group else version,
                              []).append({
                "name": resource, "singularName": kind.lower(),
                "namespaced": namespaced, "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch",
                          "update", "watch"]})
        self.documents: Dict[str, Any] = {
            "/api": {"kind": "APIVersions", "versions": ["v1"],
                     "serverAddressByClientCIDRs": [
                         {"clientCIDR": "0.0.0.0/0",
                          "serverAddress": "127.0.0.1"}]},
            "/apis": {"kind": "APIGroupList", "apiVersion": "v1",
                      "groups": []},
        }
        for group_version, resources in groups.items():
            path = ("/api/" if "/" not in group_version else "/apis/")
            self.documents[path + group_version] = {
                "kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": group_version, "resources": resources}
            if "/" in group_version:
                entry = {"groupVersion": group_version,
                         "version": group_version.split("/")[1]}
                self.documents["/apis"]["groups"].append({
                    "name": group_version.split("/")[0],
                    "versions": [entry], "preferredVersion": entry})


class _FakeApiHandler(http.server.BaseHTTPRequestHandler):
    """Answers FakeApiServer's requests."""

    server: FakeApiServer

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        """Discovery documents, else a NotFound status."""
        path = self.path.split("?", 1)[0].rstrip("/")
        body = self.server.documents.get(path)
        code = 200
        if body is None:
            code = 404
            body = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": f"{path} not found"}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Keeps the test's output quiet."""


def test_manifests_kubectl_dry_run_would_create_all(
        manifests: List[Manifest]) -> None:
    """`kubectl apply --dry-run=client --validate=false -f deploy/k8s`
    takes every object. kubectl asks a server which resources exist and
    whether each object does even in a client-side dry run, so it talks to a
    FakeApiServer on loopback through a throwaway kubeconfig.
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on the PATH (scripts/setup.sh installs "
                    "Debian's kubernetes-client); the YAML checks ran")
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with tempfile.TemporaryDirectory() as home:
            config = Path(home) / "kubeconfig"
            config.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {
                    "server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": {
                    "cluster": "fake", "user": "fake"}}],
                "current-context": "fake"}))
            env = dict(os.environ, KUBECONFIG=str(config), HOME=home)
            done = subprocess.run(
                [kubectl, "apply", "--dry-run=client", "--validate=false",
                 "-o", "name", "-f", str(K8S)],
                capture_output=True, text=True, timeout=120, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout + done.stderr
    created = done.stdout.split()
    expected = []
    for m in manifests:
        group = KINDS[m["kind"]][0]
        resource = m["kind"].lower() + (f".{group}" if group else "")
        expected.append(f"{resource}/{m['metadata']['name']}")
    assert created == expected, done.stdout + done.stderr


def dockerfile_stages() -> List[List[Tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments) with
    continuation lines joined and comments dropped.
    """
    instructions: List[Tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        word, _, rest = text.partition(" ")
        instructions.append((word.upper(), " ".join(rest.split())))
    stages: List[List[Tuple[str, str]]] = []
    for instruction in instructions:
        if instruction[0] == "FROM":
            stages.append([])
        assert stages, "the Dockerfile must start with FROM"
        stages[-1].append(instruction)
    return stages


def readme_build_commands() -> List[str]:
    """The commands of the README's sh block that builds what the image
    holds (the one block with CHORUS_BUILD_ONLY=1), comments dropped.
    """
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(),
                        re.MULTILINE | re.DOTALL)
    matching = [b for b in blocks if "CHORUS_BUILD_ONLY=1" in b]
    assert len(matching) == 1, (
        "README.md needs exactly one sh block with the image's build "
        f"commands (CHORUS_BUILD_ONLY=1), found {len(matching)}")
    commands = []
    for line in matching[0].splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(" ".join(words))
    return commands


def test_dockerfile_build_steps_are_the_readme_commands() -> None:
    """The build stage runs, on debian:12, exactly the README's commands
    that install the packages and build the binaries, in that order.
    """
    stages = dockerfile_stages()
    assert len(stages) >= 2, "a build stage and a runtime stage"
    for stage in stages:
        assert stage[0][1].split()[0] == "debian:12", stage[0]
    runs = [" ".join(shlex.split(args)) for word, args in stages[0]
            if word == "RUN" and "scripts/" in args]
    assert runs == readme_build_commands()


def test_dockerfile_runs_entrypoint_as_non_root() -> None:
    """The runtime stage runs deploy/entrypoint.sh as a numeric non-root
    user.
    """
    stage = dockerfile_stages()[-1]

    def last(word: str) -> str:
        return [a for w, a in stage if w == word][-1]

    assert json.loads(last("ENTRYPOINT")) == ["/usr/local/bin/chorus"]
    assert "deploy/entrypoint.sh /usr/local/bin/chorus" in [
        a for w, a in stage if w == "COPY"]
    user = last("USER").split(":")[0]
    assert user.isdigit() and int(user) != 0
    assert os.access(ENTRYPOINT, os.X_OK)


def program_help(bins: Dict[str, Path], program: str) -> str:
    """--help of `program` run through the image's entry point, with the
    built binaries on the PATH.
    """
    path = os.pathsep.join(sorted({str(p.parent) for p in bins.values()}))
    done = subprocess.run(
        ["sh", str(ENTRYPOINT), program, "--help"], capture_output=True,
        text=True, timeout=60,
        env=dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ['PATH']}"))
    text = done.stdout + done.stderr
    assert "--help" in text or "Flags from" in text, text
    return text


def help_flags(text: str) -> Set[str]:
    """The flag names an Abseil --help lists."""
    return set(re.findall(r"^\s+--([A-Za-z_][A-Za-z0-9_]*) \(", text,
                          re.MULTILINE))


def test_flags_in_manifests_exist_in_help(
        manifests: List[Manifest], bins: Dict[str, Path]) -> None:
    """Every flag the manifests give a daemon or chorusctl is one its --help
    lists, asked through the image's entry point.
    """
    used: Dict[str, Set[str]] = {}
    for workload in workloads(manifests):
        for container in containers(workload):
            if container.get("command", [None])[0] == ETCD:
                used.setdefault(ETCD, set()).update(
                    flags_of(container["args"]))
                continue
            program, *args = container["args"]
            used.setdefault(program, set()).update(flags_of(args))
            for _, probe in probes(container):
                command = probe.get("exec", {}).get("command", [])
                if command[:1] == ["chorusctl"]:
                    used.setdefault("chorusctl", set()).update(
                        flags_of(command[1:]))
    assert {COORDINATOR, WORKER, ETCD} <= set(used)
    etcd_flags = used.pop(ETCD)
    if shutil.which(ETCD) is not None:
        text = subprocess.run([ETCD, "--help"], capture_output=True,
                              text=True, timeout=60).stdout
        listed = set(re.findall(r"^\s+--([a-z0-9-]+)\b", text, re.MULTILINE))
        assert etcd_flags <= listed, (
            f"etcd: {sorted(etcd_flags - listed)} not in its --help")
    for program, flags in used.items():
        listed = help_flags(program_help(bins, program))
        assert listed, f"{program} --help lists no flags"
        assert flags <= listed, (
            f"{program}: {sorted(flags - listed)} not in its --help")


def runtime_installs() -> List[str]:
    """What the Dockerfile's runtime stage gives apt-get install."""
    installs = []
    for word, args in dockerfile_stages()[-1]:
        if word != "RUN":
            continue
        for command in args.split("&&"):
            words = shlex.split(command)
            if "install" in words and "apt-get" in " ".join(words):
                after = words[words.index("install") + 1:]
                installs += [w for w in after if not w.startswith("-")]
    assert installs, "the runtime stage installs nothing"
    return installs


def test_dockerfile_runtime_installs_the_daemons_package() -> None:
    """The runtime stage installs the chorus Debian package the build stage
    made (scripts/package.sh daemons), and nothing else: the package's
    dependencies, which dpkg-shlibdeps computes from the binaries, bring the
    shared libraries (tests/install checks the package), so the image keeps
    no list of its own.
    """
    build, runtime = dockerfile_stages()[0], dockerfile_stages()[-1]
    runs = [" ".join(shlex.split(args)) for word, args in build
            if word == "RUN"]
    assert "CHORUS_BUILD_ONLY=1 scripts/package.sh daemons" in runs
    copies = [args.split() for word, args in runtime if word == "COPY"]
    assert ["--from=build", "/src/build/packages/chorus_*.deb",
            "/tmp/"] in copies
    assert runtime_installs() == ["/tmp/chorus_*.deb"]
    # The image's user exists before the package's postinst looks for it.
    first_run = next(args for word, args in runtime if word == "RUN")
    assert "useradd" in first_run and "--uid 10001" in first_run


def local_args(args: List[str], paths: Dict[str, Path],
               values: Dict[str, str]) -> List[str]:
    """A container's args (or probe command) for a daemon on this machine:
    mount paths replaced by `paths`' folders, $(VAR) by `values`, addresses
    on every interface by 127.0.0.1 and fixed ports by 0.
    """
    out = []
    for arg in args:
        for mount, folder in paths.items():
            arg = re.sub(re.escape(mount) + r"(?=/|$)",
                         lambda _, f=folder: str(f), arg)
        for var, value in values.items():
            arg = arg.replace(f"$({var})", value)
        name, eq, value = arg.partition("=")
        if eq and value.startswith("0.0.0.0:"):
            arg = f"{name}=127.0.0.1:0"
        elif eq and name in ("--data_port", "--call_port"):
            arg = f"{name}=0"
        out.append(arg)
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalEtcd:
    """One etcd member on loopback run with the manifest's own TLS flags
    and paths (the cluster's addresses are the manifest's DNS names, so
    one member on free loopback ports stands in for the three).
    """

    CLUSTER_FLAGS = ("name", "data-dir", "listen-client-urls",
                     "advertise-client-urls", "listen-peer-urls",
                     "initial-advertise-peer-urls", "initial-cluster",
                     "listen-metrics-urls")

    def __init__(self, spec: Dict[str, Any], paths: Dict[str, Path],
                 folder: Path) -> None:
        self.client_url = f"https://127.0.0.1:{free_port()}"
        peer_url = f"https://127.0.0.1:{free_port()}"
        self.health_url = f"http://127.0.0.1:{free_port()}/health"
        kept = [a for a in local_args(spec["args"], paths, {})
                if a[2:].partition("=")[0] not in self.CLUSTER_FLAGS]
        args = [ETCD, *kept, "--name=chorus-etcd-0",
                f"--data-dir={folder / 'etcd-data'}",
                f"--listen-client-urls={self.client_url}",
                f"--advertise-client-urls={self.client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=chorus-etcd-0={peer_url}",
                f"--listen-metrics-urls={self.health_url[:-7]}"]
        self.paths_ca = paths["/etc/etcd/tls"] / "ca.pem"
        self.log_path = folder / "etcd.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        self._wait_healthy(time.monotonic() + 60)

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                with urllib.request.urlopen(self.health_url,
                                            timeout=2) as answer:
                    if json.load(answer).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"etcd not healthy:\n{self.log_path.read_text()}")

    def answers(self, tls_dir: Path) -> bool:
        """Whether the member serves /version to a client showing the
        certificate in tls_dir (False when the handshake or call fails).
        """
        context = ssl.create_default_context(
            cafile=str(self.paths_ca))
        context.check_hostname = False
        context.load_cert_chain(str(tls_dir / "cert.pem"),
                                str(tls_dir / "key.pem"))
        try:
            with urllib.request.urlopen(f"{self.client_url}/version",
                                        timeout=10, context=context) as got:
                return got.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """Kills the member and reaps it."""
        self.process.kill()
        self.process.wait(timeout=30)


def run_exec_probes(spec: Dict[str, Any], paths: Dict[str, Path],
                    address: str, env: Dict[str, str]) -> List[str]:
    """Runs the container's exec probes here, dialing `address` where they
    dial a coordinator; asserts each passes. Returns their outputs.
    """
    outputs = []
    for kind, probe in probes(spec):
        if "exec" not in probe:
            continue
        command = local_args(probe["exec"]["command"], paths, {})
        command = [f"--coordinator={address}"
                   if a.startswith("--coordinator=") else a for a in command]
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=30, env=env)
        assert done.returncode == 0, (
            f"{spec['name']} {kind} {command}: {done.stdout}{done.stderr}")
        outputs.append(done.stdout)
    return outputs


def test_manifests_args_and_probes_work_on_real_daemons(
        manifests: List[Manifest], bins: Dict[str, Path],
        tmp_path: Path) -> None:
    """etcd with the manifest's TLS flags, two coordinators and a worker
    started with the manifests' own args (on loopback, with certificates
    laid out as deploy/README.md puts them in the Secrets) serve mutual
    TLS: the coordinators elect a leader over TLS to etcd, the worker
    registers under its pod's name through the list, and every exec probe
    of the manifests passes on the leader and on the standby.
    """
    if shutil.which(ETCD) is None:
        pytest.skip("etcd is not on the PATH (scripts/setup.sh installs "
                    "Debian's etcd-server)")
    pod = "chorus-worker-0"
    certs = make_certs(tmp_path / "certs", workers=(pod,), clients=(),
                       admins=("probe",))
    subprocess.run(["bash", str(REPO / "scripts" / "dev_certs.sh"),
                    f"--out={certs}", "--admins=", "--etcd=localhost"],
                   check=True, capture_output=True, timeout=120)
    # chorus-worker-tls: ca.pem and NAME.cert.pem, NAME.key.pem per worker.
    worker_tls = tmp_path / "worker-tls"
    worker_tls.mkdir()
    shutil.copy(certs / "ca.pem", worker_tls / "ca.pem")
    for part in ("cert", "key"):
        shutil.copy(certs / f"worker-{pod}" / f"{part}.pem",
                    worker_tls / f"{pod}.{part}.pem")
    run_dir = short_temp_dir()
    paths = {"/etc/chorus/tls": certs / "coordinator",
             "/etc/chorus/probe": certs / "admin-probe",
             "/etc/chorus/etcd": certs / "etcd" / "client",
             "/etc/etcd/tls": certs / "etcd" / "server",
             "/run/chorus": run_dir}
    _, coordinator_spec = workload_running(manifests, COORDINATOR)
    _, worker_spec = workload_running(manifests, WORKER)
    etcd = LocalEtcd(etcd_workload(manifests)[1], paths, tmp_path)
    # Only the coordinators' etcd certificate is an etcd client; no Chorus
    # identity is, the coordinator's included.
    assert etcd.answers(paths["/etc/chorus/etcd"])
    assert not etcd.answers(paths["/etc/chorus/tls"])
    daemons: List[Daemon] = []
    try:
        for i in range(2):
            args = [a for a in local_args(coordinator_spec["args"][1:],
                                          paths, {"POD_NAME": f"c{i}"})
                    if not a.startswith("--advertise=")]
            args = [f"--etcd={etcd.client_url}" if a.startswith("--etcd=")
                    else a for a in args]
            daemons.append(Daemon(f"coordinator{i}", [
                str(bins["chorus-coordinator"]), *args], tmp_path))
        addresses = ",".join(d.address for d in daemons)
        worker_paths = dict(paths, **{"/etc/chorus/tls": worker_tls})
        worker_args = local_args(worker_spec["args"][1:], worker_paths,
                                 {"POD_NAME": pod, "POD_IP": "127.0.0.1"})
        worker_args = [a if not a.startswith("--coordinator=") else
                       f"--coordinator={addresses}" for a in worker_args]
        # Daemon adds --port_file=run_dir/worker.port, the manifest's.
        assert f"--port_file={run_dir}/worker.port" in worker_args
        daemons.append(Daemon("worker", [str(bins["chorus-worker"]),
                                         *worker_args], run_dir))
        bin_path = os.pathsep.join(sorted({str(p.parent)
                                           for p in bins.values()}))
        env = dict(os.environ,
                   PATH=f"{bin_path}{os.pathsep}{os.environ['PATH']}")
        for coordinator in daemons[:2]:
            for output in run_exec_probes(coordinator_spec, paths,
                                          coordinator.address, env):
                assert pod in output, output
        run_exec_probes(worker_spec, paths, addresses, env)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
        etcd.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
