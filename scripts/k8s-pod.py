"""Runs a Deployment's Pod the way the kubelet would, on this host, without a
cluster: its init containers, then its first container until its readiness
probe answers 200.

What is reproduced: the Pod's user, group and fsGroup (as a supplementary
group), its Secret and ConfigMap volumes with the kubelet's ownership and
modes (files owned by root with the volume's `defaultMode`; with an
`fsGroup`, the group is the fsGroup and the files are made group-readable,
as the kubelet does for read-only volumes), the containers' arguments and
environment. What is mapped: mount paths live under --root, the image's
binary is --bin, and the container's probe port is a free local port
(`OUTBOXD_WORKER__HEALTH_LISTEN`). The Secret's values come from
--secret KEY=VALUE (the manifest's placeholders are not real servers).

Prints one JSON object: each init container's exit code and stderr, whether
the container became ready, and its stderr.

    k8s-pod.py --deployment deploy/kubernetes/deployment.yaml \
        --configmap deploy/kubernetes/configmap.yaml --root DIR --bin outboxd \
        --secret database-url=postgres://… --secret amqp-url=amqp://… \
        [--no-fs-group] [--secret-mode 0400]
"""

import argparse
import json
import shutil
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import yaml


def first_of_kind(path, kind, name=None):
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name):
                return doc
    raise SystemExit(f"no {kind} in {path}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_volume(root, mount, files, mode, fs_group):
    """Writes a volume's files as the kubelet would and returns their paths."""
    target = root + mount["mountPath"]
    sub = mount.get("subPath")
    written = []
    if sub:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        items = {target: files[sub]}
    else:
        os.makedirs(target, exist_ok=True)
        os.chmod(target, 0o755)
        items = {os.path.join(target, k): v for k, v in files.items()}
    for path, content in items.items():
        with open(path, "w") as f:
            f.write(content)
        os.chown(path, 0, 0)
        file_mode = mode
        if fs_group is not None:
            os.chown(path, 0, fs_group)
            file_mode |= 0o440
        os.chmod(path, file_mode)
        written.append(path)
    return written


def mapped(value, root, mounts):
    for m in mounts:
        if value.startswith(m["mountPath"]):
            return root + value
    return value


def run(args):
    deployment = first_of_kind(args.deployment, "Deployment", args.name)
    configmap = first_of_kind(args.configmap, "ConfigMap")
    pod = deployment["spec"]["template"]["spec"]
    security = pod.get("securityContext", {})
    uid = security["runAsUser"]
    gid = security.get("runAsGroup", uid)
    fs_group = None if args.no_fs_group else security.get("fsGroup")
    secrets = dict(s.split("=", 1) for s in args.secret)
    root = os.path.abspath(args.root)
    volumes = {v["name"]: v for v in pod["volumes"]}
    # The image's binary, where the Pod's user can run it.
    os.makedirs(root + "/usr/bin", exist_ok=True)
    os.chmod(root, 0o755)
    binary = root + "/usr/bin/outboxd"
    shutil.copy(args.bin, binary)
    os.chmod(binary, 0o755)

    def prepare(container):
        mounts = container.get("volumeMounts", [])
        for m in mounts:
            volume = volumes[m["name"]]
            if "secret" in volume:
                spec = volume["secret"]
                keys = [i["key"] for i in spec.get("items", [])] or list(secrets)
                files = {k: secrets[k] for k in keys}
                mode = int(args.secret_mode, 8) if args.secret_mode else spec.get("defaultMode", 0o644)
            else:
                spec = volume["configMap"]
                files = configmap["data"]
                mode = spec.get("defaultMode", 0o644)
            write_volume(root, m, files, mode, fs_group)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/"}
        for e in container.get("env", []):
            env[e["name"]] = mapped(e["value"], root, mounts)
        argv = [binary] + [mapped(a, root, mounts) for a in container.get("args", [])]
        groups = f"--groups={fs_group}" if fs_group is not None else "--clear-groups"
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", groups] + argv, env

    report = {"init": [], "ready": False, "stderr": ""}
    for container in pod.get("initContainers", []):
        argv, env = prepare(container)
        done = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, timeout=120)
        report["init"].append({"name": container["name"], "code": done.returncode, "stderr": done.stderr})
        if done.returncode != 0:
            print(json.dumps(report))
            return

    container = pod["containers"][0]
    argv, env = prepare(container)
    probe = container["readinessProbe"]["httpGet"]
    port = free_port()
    env["OUTBOXD_WORKER__HEALTH_LISTEN"] = f"127.0.0.1:{port}"
    log = os.path.join(root, "container.log")
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe['path']}", timeout=2) as r:
                    if r.status == 200:
                        report["ready"] = True
                        report["readyz"] = r.read().decode()
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        report["exit"] = proc.returncode
        with open(log) as f:
            report["stderr"] = f.read()
    print(json.dumps(report))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deployment", required=True)
    p.add_argument("--name", help="the Deployment's name (default: the first)")
    p.add_argument("--configmap", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--bin", required=True)
    p.add_argument("--secret", action="append", default=[])
    p.add_argument("--no-fs-group", action="store_true")
    p.add_argument("--secret-mode")
    p.add_argument("--timeout", type=float, default=60)
    run(p.parse_args())


if __name__ == "__main__":
    main()
