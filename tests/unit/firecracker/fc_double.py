#!/usr/bin/env python3
"""fc_double.py: a test double of Firecracker for the driver's contract
tests, never a backend. Run as the driver runs Firecracker
(`fc_double.py --api-sock PATH --id ID`, or `--version`), it serves the
REST API on the Unix socket and checks every request against the OpenAPI
spec (FC_DOUBLE_SPEC: path, method, body required or forbidden, required
fields, no unknown fields, types, enums, bounds) plus the rules the spec
states in words (pre-boot / post-boot only, logger once, snapshot load only
on a fresh process, snapshot create only while paused, ids in the path and
body agree). It answers as the spec says: 204 or 200 with JSON, or 400
with {"fault_message": ...}. After InstanceStart (or a snapshot load) it
plays the guest side of the hybrid vsock on uds_path: the first
FC_DOUBLE_VSOCK_CLOSE connections are closed (agent still booting), later
ones to port FC_DOUBLE_GUEST_PORT get "OK <n>\\n" and an echo.
Every request is appended as one JSON line to FC_DOUBLE_LOG (default
double.jsonl in the working folder) for the tests to read.
FC_DOUBLE_MODE: "" normal; "exit-early" prints and exits 152 before the
socket exists; "no-socket" never listens; "fault=PATH" answers PUT PATH
with a 400; "exit-on=PATH" exits 1 when PATH is called. SIGUSR2 makes a
serving double log a fatal error and exit 1 (a VMM failing by itself).

Agent mode (FC_DOUBLE_AGENT=path of moat-agent, for moat-vmd's contract
test): the guest side of the vsock is a proxy to a real moat-agent in its
host mode (`--listen unix:agent.sock --root guest-root`, both in the
working folder), started when the VM first runs (InstanceStart, a load
with resume_vm, or PATCH /vm Resumed), stopped with SIGSTOP while the VM
is paused and SIGCONT on resume, and killed with the double. The double
itself, like Firecracker, has no parent-death signal: spawned so by vmd,
it outlives a killed vmd, and a restarted vmd adopts it. As in
Firecracker, a host CONNECT is answered "OK <n>" only once the guest runs
and listens, so a CONNECT to a paused VM waits; the connection then
carries the agent's stream. PUT /snapshot/create writes the state file
(JSON: the configuration) and the memory file (a tar of guest-root, the
only "guest memory" the double has); PUT /snapshot/load in a fresh process
checks both exist and are what create wrote, unpacks guest-root from the
memory file and starts a new agent on it. That is NOT a VM restore: no
memory, no processes, no open files survive, only guest-root's files, and
the agent is a new process that says AgentReady again (as a real guest's
agent does when it accepts the host's new vsock connection).
The arguments are parsed as Firecracker's parser does: --api-sock, --id
and the ones the jailer adds (--start-time-us, --start-time-cpu-us,
--parent-cpu-time-us); an unknown or repeated one exits 153.
Not for: anything but tests; it runs no VM.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler

import yaml

VERSION = "1.17.0-dev"
# Firecracker's own options that take a value, the jailer's included.
VALUE_ARGS = ("--api-sock", "--id", "--start-time-us", "--start-time-cpu-us",
              "--parent-cpu-time-us")
ID_RE = re.compile(r"^[A-Za-z0-9_]+$")

PRE_BOOT_ONLY = {
    ("PUT", "/boot-source"), ("PUT", "/drives/{drive_id}"),
    ("PUT", "/machine-config"), ("PATCH", "/machine-config"),
    ("PUT", "/vsock"), ("PUT", "/network-interfaces/{iface_id}"),
    ("PUT", "/snapshot/load"), ("PUT", "/cpu-config"),
    ("PUT", "/entropy"), ("PUT", "/balloon"), ("PUT", "/mmds/config"),
    ("PUT", "/pmem/{id}"), ("PUT", "/serial"), ("PUT", "/hotplug/memory"),
}
POST_BOOT_ONLY = {
    ("PATCH", "/vm"), ("PUT", "/snapshot/create"),
    ("PATCH", "/drives/{drive_id}"),
    ("PATCH", "/network-interfaces/{iface_id}"),
}
# What a fresh process may receive before PUT /snapshot/load.
LOAD_ALLOWED_BEFORE = {"/logger", "/metrics"}


class Violation(Exception):
    pass


class Spec:
    def __init__(self, path):
        with open(path) as f:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            self.doc = yaml.load(f, Loader=loader)
        self.defs = self.doc["definitions"]
        self.routes = []
        for tmpl, item in self.doc["paths"].items():
            names = re.findall(r"{(\w+)}", tmpl)
            rx = "^" + re.sub(r"{\w+}", "([^/]+)", tmpl) + "$"
            self.routes.append((re.compile(rx), tmpl, names, item))

    def route(self, method, path):
        for rx, tmpl, names, item in self.routes:
            m = rx.match(path)
            if m:
                op = item.get(method.lower())
                if op is None:
                    raise Violation("Invalid request method and/or path: "
                                    "%s %s." % (method, path))
                return tmpl, dict(zip(names, m.groups())), op
        raise Violation("Invalid request method and/or path: %s %s." %
                        (method, path))

    def resolve(self, schema):
        while "$ref" in schema:
            schema = self.defs[schema["$ref"].split("/")[-1]]
        return schema

    def check(self, schema, value, where):
        schema = self.resolve(schema)
        t = schema.get("type", "object" if "properties" in schema else None)
        if t == "object":
            if not isinstance(value, dict):
                raise Violation("%s: expected an object" % where)
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties", False)
            for req in schema.get("required", []):
                if req not in value:
                    raise Violation("%s: missing field `%s`" % (where, req))
            for k, v in value.items():
                if k in props:
                    self.check(props[k], v, where + "." + k)
                elif extra is True:
                    continue
                elif isinstance(extra, dict):
                    self.check(extra, v, where + "." + k)
                else:
                    raise Violation("%s: unknown field `%s`, expected one "
                                    "of %s" % (where, k, sorted(props)))
        elif t == "string":
            if not isinstance(value, str):
                raise Violation("%s: expected a string" % where)
        elif t == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise Violation("%s: expected an integer" % where)
            if "minimum" in schema and value < schema["minimum"]:
                raise Violation("%s: %d is below %s" %
                                (where, value, schema["minimum"]))
            if "maximum" in schema and value > schema["maximum"]:
                raise Violation("%s: %d is above %s" %
                                (where, value, schema["maximum"]))
        elif t == "boolean":
            if not isinstance(value, bool):
                raise Violation("%s: expected a boolean" % where)
        elif t == "array":
            if not isinstance(value, list):
                raise Violation("%s: expected an array" % where)
            for i, v in enumerate(value):
                self.check(schema.get("items", {}), v, "%s[%d]" % (where, i))
        if "enum" in schema and value not in schema["enum"]:
            raise Violation("%s: `%s` is not one of %s" %
                            (where, value, schema["enum"]))


GUEST_ROOT = "guest-root"
AGENT_SOCK = "agent.sock"
SNAP_MAGIC = "moat fc_double snapshot v1"
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """preexec_fn: the agent gets SIGKILL when the thread that started it
    (a keeper thread that lives as long as the agent) or the double
    dies, so a killed double leaves no agent behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Guest:
    """Agent mode's stand-in for the guest: a moat-agent in host mode on
    AGENT_SOCK serving GUEST_ROOT, both in the working folder. `running`
    is whether the VM runs (the agent is SIGSTOPped while it is paused);
    `conns` are the proxied host connections. Guarded by cv."""

    def __init__(self):
        self.cv = threading.Condition()
        self.agent = os.environ["FC_DOUBLE_AGENT"]
        self.root = os.path.abspath(GUEST_ROOT)
        self.sock = os.path.abspath(AGENT_SOCK)
        self.proc = None
        self.running = False
        self.reset_pending = False
        self.conns = set()

    def fresh(self):
        for d in ("root", "tmp"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)

    def unpack(self, mem_file):
        """guest-root as a snapshot's memory file holds it."""
        if os.path.exists(self.root):
            shutil.rmtree(self.root)
        os.makedirs(self.root)
        with tarfile.open(mem_file) as t:
            for m in t.getmembers():
                if m.name.startswith("/") or ".." in m.name.split("/"):
                    raise Violation("Load snapshot error: memory file "
                                    "holds %s" % m.name)
            if hasattr(tarfile, "data_filter"):
                t.extractall(self.root, filter="data")
            else:
                t.extractall(self.root)

    def pack(self, mem_file):
        with tarfile.open(mem_file, "w") as t:
            t.add(self.root, arcname=".")

    def _start_locked(self):
        started = threading.Event()

        def keeper():
            if os.path.exists(self.sock):
                os.unlink(self.sock)
            self.proc = subprocess.Popen(
                [self.agent, "--listen", "unix:" + self.sock, "--root",
                 self.root], stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent)
            started.set()
            self.proc.wait()

        threading.Thread(target=keeper, daemon=True).start()
        started.wait()

    def run(self):
        """The VM runs: boot, a load with resume_vm, or a resume."""
        with self.cv:
            if self.proc is None:
                self._start_locked()
            elif not self.running:
                self.proc.send_signal(signal.SIGCONT)
            self.running = True
            if self.reset_pending:
                # Firecracker resets the vsock device when it snapshots:
                # the connections open then are closed once the guest
                # runs again; its listeners survive.
                self.reset_pending = False
                for c in list(self.conns):
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            self.cv.notify_all()

    def pause(self):
        with self.cv:
            if self.proc is not None and self.running:
                self.proc.send_signal(signal.SIGSTOP)
            self.running = False

    def snapshotted(self):
        with self.cv:
            if os.environ.get("FC_DOUBLE_SNAPSHOT_RESETS_VSOCK", "1") != "0":
                self.reset_pending = True

    def connect(self, conn):
        """A host CONNECT to the agent's port: waits until the VM runs
        (Firecracker says OK only when the guest answers), then proxies
        conn to the agent. Closes conn when the agent cannot be reached,
        as Firecracker does when nothing in the guest listens."""
        with self.cv:
            while not self.running:
                self.cv.wait()
        agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        until = time.monotonic() + 10
        while True:
            try:
                agent.connect(self.sock)
                break
            except OSError:
                if time.monotonic() > until:
                    agent.close()
                    conn.close()
                    return
                time.sleep(0.02)
        with self.cv:
            self.conns.add(conn)
        try:
            conn.sendall(b"OK 1073741824\n")
        except OSError:
            pass
        t = threading.Thread(target=pipe, args=(agent, conn), daemon=True)
        t.start()
        pipe(conn, agent)
        t.join()
        with self.cv:
            self.conns.discard(conn)
        conn.close()
        agent.close()


def pipe(src, dst):
    """Copies src to dst until either ends, then ends both directions."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Vmm:
    """The state a Firecracker keeps; guarded by lock."""

    def __init__(self, args):
        self.lock = threading.Lock()
        self.args = args
        self.state = "Not started"
        self.configured = set()
        self.config = {}
        self.drives = {}
        self.logger = None
        self.vsock = None
        self.vsock_started = False
        self.mode = os.environ.get("FC_DOUBLE_MODE", "")
        self.log_path = os.environ.get("FC_DOUBLE_LOG", "double.jsonl")
        self.guest = Guest() if os.environ.get("FC_DOUBLE_AGENT") else None

    def record(self, entry):
        with open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def log(self, text):
        if self.logger:
            with open(self.logger, "a") as f:
                f.write("[%s:INFO] %s\n" % (self.args.get("--id", "?"),
                                             text))


def need_file(path, what):
    if not os.path.exists(path):
        raise Violation("%s %s: No such file or directory (os error 2)" %
                        (what, path))


def apply(vmm, method, tmpl, params, body):
    """The rules the spec states in words, and the effect of a call."""
    key = (method, tmpl)
    started = vmm.state != "Not started"
    if key in PRE_BOOT_ONLY and started:
        raise Violation("The requested operation is not supported after "
                        "starting the microVM.")
    if key in POST_BOOT_ONLY and not started:
        raise Violation("The requested operation is not supported before "
                        "starting the microVM.")
    for name, value in params.items():
        if not ID_RE.match(value):
            raise Violation("Invalid ID: %s" % value)
        if isinstance(body, dict) and name in body and body[name] != value:
            raise Violation("The id from the path [%s] does not match the "
                            "id from the body [%s]!" % (value, body[name]))
    if tmpl == "/logger":
        if vmm.logger is not None:
            raise Violation("Logger already initialized")
        if "log_path" in body:
            need_file(body["log_path"], "Logger: cannot open")
            vmm.logger = body["log_path"]
    elif tmpl == "/metrics":
        if "/metrics" in vmm.configured:
            raise Violation("Reinitialization of metrics not allowed.")
        need_file(body["metrics_path"], "Metrics: cannot open")
    elif tmpl == "/boot-source":
        need_file(body["kernel_image_path"], "Kernel file")
        if "initrd_path" in body:
            need_file(body["initrd_path"], "Initrd file")
    elif tmpl == "/drives/{drive_id}" and method == "PUT":
        if "path_on_host" in body:
            need_file(body["path_on_host"],
                      "Unable to open the block device backing file")
        vmm.drives[params["drive_id"]] = body
    elif tmpl == "/vsock":
        vmm.vsock = body
    elif tmpl == "/machine-config" and method == "PUT":
        if body.get("smt") and body["vcpu_count"] not in [1] + \
                list(range(2, 33, 2)):
            raise Violation("The vCPU number is invalid! The vCPU number "
                            "can only be 1 or an even number when SMT is "
                            "enabled.")
    elif tmpl == "/actions":
        if body["action_type"] == "InstanceStart":
            if started:
                raise Violation("The requested operation is not supported "
                                "after starting the microVM.")
            if "/boot-source" not in vmm.configured:
                raise Violation("Cannot start microvm without kernel "
                                "configuration.")
            kernel = vmm.config["boot-source"]["kernel_image_path"]
            with open(kernel, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    raise Violation("Start microvm error: Cannot load "
                                    "kernel due to invalid memory "
                                    "configuration or invalid kernel "
                                    "image: Kernel Loader: failed to load "
                                    "ELF kernel image")
            vmm.state = "Running"
            start_vsock(vmm)
            if vmm.guest:
                vmm.guest.fresh()
                vmm.guest.run()
    elif tmpl == "/vm":
        vmm.state = "Paused" if body["state"] == "Paused" else "Running"
        if vmm.guest and vmm.state == "Paused":
            vmm.guest.pause()
        elif vmm.guest:
            vmm.guest.run()
    elif tmpl == "/snapshot/create":
        if vmm.state != "Paused":
            raise Violation("Create snapshot error: Cannot save the "
                            "microVM state: the microVM must be paused.")
        with open(body["snapshot_path"], "w") as f:
            json.dump({"magic": SNAP_MAGIC, "vsock": vmm.vsock,
                       "drives": vmm.drives, "config": vmm.config,
                       "guest": vmm.guest is not None}, f)
        if vmm.guest:
            vmm.guest.pack(body["mem_file_path"])
            vmm.guest.snapshotted()
        else:
            with open(body["mem_file_path"], "wb") as f:
                f.write(b"\0" * 4096)
    elif tmpl == "/snapshot/load":
        if vmm.configured - LOAD_ALLOWED_BEFORE:
            raise Violation("Loading a microVM snapshot not allowed after "
                            "configuring boot-specific resources.")
        if ("mem_backend" in body) == ("mem_file_path" in body):
            raise Violation("Exactly one of mem_backend or mem_file_path "
                            "must be given.")
        need_file(body["snapshot_path"], "Load snapshot error: state file")
        mem = body.get("mem_backend", {}).get("backend_path",
                                              body.get("mem_file_path"))
        need_file(mem, "Load snapshot error: memory file")
        try:
            with open(body["snapshot_path"]) as f:
                snap = json.load(f)
        except ValueError:
            raise Violation("Load snapshot error: %s is not a snapshot "
                            "state file" % body["snapshot_path"])
        if snap.get("magic", SNAP_MAGIC) != SNAP_MAGIC:
            raise Violation("Load snapshot error: %s is not a snapshot "
                            "state file" % body["snapshot_path"])
        for d in snap["drives"].values():
            need_file(d["path_on_host"], "Load snapshot error: drive")
        if vmm.guest:
            if not snap.get("guest") or not tarfile.is_tarfile(mem):
                raise Violation("Load snapshot error: memory file %s was "
                                "not written by this double's agent mode"
                                % mem)
            vmm.guest.unpack(mem)
        vmm.vsock = snap["vsock"]
        if "vsock_override" in body:
            vmm.vsock = dict(vmm.vsock,
                             uds_path=body["vsock_override"]["uds_path"])
        vmm.drives = snap["drives"]
        vmm.state = "Running" if body.get("resume_vm") else "Paused"
        start_vsock(vmm)
        if vmm.guest and vmm.state == "Running":
            vmm.guest.run()
    vmm.configured.add(tmpl)
    if isinstance(body, dict):
        vmm.config[tmpl.strip("/")] = body
    vmm.log("%s %s done" % (method, tmpl))


def start_vsock(vmm):
    if vmm.vsock is None or vmm.vsock_started:
        return
    vmm.vsock_started = True
    path = vmm.vsock["uds_path"]
    if os.path.exists(path):
        os.unlink(path)
    lsn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsn.bind(path)
    lsn.listen(8)
    threading.Thread(target=vsock_loop, args=(lsn, vmm.guest),
                     daemon=True).start()


def vsock_loop(lsn, guest):
    closes = int(os.environ.get("FC_DOUBLE_VSOCK_CLOSE", "2"))
    port = os.environ.get("FC_DOUBLE_GUEST_PORT", "1024")
    answer = os.environ.get("FC_DOUBLE_VSOCK_ANSWER", "")
    while True:
        conn, _ = lsn.accept()
        line = b""
        while not line.endswith(b"\n") and len(line) < 64:
            b = conn.recv(1)
            if not b:
                break
            line += b
        if closes > 0 or line != ("CONNECT %s\n" % port).encode():
            closes -= 1
            conn.close()
            continue
        if guest is not None and not answer:
            threading.Thread(target=guest.connect, args=(conn,),
                             daemon=True).start()
            continue
        conn.sendall((answer or "OK 1073741824\n").encode())
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def echo(conn):
    while True:
        data = conn.recv(4096)
        if not data:
            conn.close()
            return
        conn.sendall(data)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, obj=None):
        data = json.dumps(obj).encode() if obj is not None else b""
        self.send_response(code)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def handle_any(self, method):
        vmm = self.server.vmm
        spec = self.server.spec
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        entry = {"method": method, "path": self.path, "body": None}
        try:
            if raw:
                try:
                    entry["body"] = body = json.loads(raw)
                except ValueError as e:
                    raise Violation("Invalid JSON: %s" % e)
            else:
                body = None
            if len(raw) > 51200:
                raise Violation("Request payload with size %d is larger "
                                "than the limit of 51200" % len(raw))
            tmpl, params, op = spec.route(method, self.path)
            bparam = [p for p in op.get("parameters", [])
                      if p.get("in") == "body"]
            if method == "GET" and raw:
                raise Violation("GET request cannot have a body.")
            if bparam:
                if body is None and (bparam[0].get("required") or
                                     method in ("PUT", "PATCH")):
                    raise Violation("Empty %s request." % method)
                if body is not None:
                    spec.check(bparam[0]["schema"], body, "body")
            elif body is not None:
                raise Violation("%s %s takes no body" % (method, tmpl))
            mode = vmm.mode
            if mode == "exit-on=" + self.path:
                vmm.log("exiting on purpose at %s" % self.path)
                os._exit(1)
            if mode == "fault=" + self.path:
                raise Violation("Injected fault for %s (test double)" %
                                self.path)
            with vmm.lock:
                if method == "GET":
                    out = self.get(vmm, tmpl)
                else:
                    apply(vmm, method, tmpl, params, body)
                    out = None
            entry["status"] = 200 if method == "GET" else 204
            vmm.record(entry)
            self.reply(entry["status"], out)
        except Violation as e:
            entry["status"] = 400
            entry["fault"] = str(e)
            vmm.record(entry)
            vmm.log("API request failed: %s" % e)
            self.reply(400, {"fault_message": str(e)})

    def get(self, vmm, tmpl):
        if tmpl == "/":
            return {"app_name": "Firecracker",
                    "id": vmm.args.get("--id", "anonymous-instance"),
                    "state": vmm.state, "vmm_version": VERSION}
        if tmpl == "/version":
            return {"firecracker_version": VERSION}
        if tmpl == "/machine-config":
            return vmm.config.get("machine-config",
                                  {"vcpu_count": 1, "mem_size_mib": 128})
        if tmpl == "/vm/config":
            return {"drives": list(vmm.drives.values())}
        raise Violation("%s is not served by the test double" % tmpl)

    def do_GET(self):
        self.handle_any("GET")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main():
    argv = sys.argv[1:]
    if "--version" in argv:
        print("Firecracker v%s (moat test double)" % VERSION)
        return 0
    args = {}
    i = 0
    while i < len(argv):
        if argv[i] in VALUE_ARGS and argv[i] in args:
            # Firecracker's parser refuses a repeated argument (the jailer
            # passes --id itself, so the caller must not repeat it).
            print("Arguments parsing error: The argument '%s' was "
                  "provided more than once." % argv[i][2:], file=sys.stderr)
            return 153
        if argv[i] in VALUE_ARGS and i + 1 < len(argv) and \
                not argv[i + 1].startswith("--"):
            args[argv[i]] = argv[i + 1]
            i += 2
        else:
            print("Arguments parsing error: Found argument '%s' which "
                  "wasn't expected, or isn't valid in this context." %
                  argv[i], file=sys.stderr)
            return 153
    mode = os.environ.get("FC_DOUBLE_MODE", "")
    if mode == "exit-early":
        print("Running Firecracker v%s" % VERSION)
        print("Error: RunWithApiError(BuildMicroVm(Kvm(Kvm(Error(2)))))",
              file=sys.stderr)
        return 152
    if mode == "no-socket":
        time.sleep(3600)
        return 0
    spec = Spec(os.environ.get("FC_DOUBLE_SPEC", "firecracker-api.yaml"))
    sock = args.get("--api-sock", "/run/firecracker.socket")
    if os.path.exists(sock):
        os.unlink(sock)
    srv = Server(sock, Handler)
    srv.vmm = Vmm(args)
    srv.spec = spec

    def fatal(signum, frame):
        # A VMM that fails on its own: a last log line, exit code 1.
        srv.vmm.log("Fatal error: SIGUSR2 from the test (test double)")
        print("Firecracker exiting with code 1 (test double)", flush=True)
        os._exit(1)

    signal.signal(signal.SIGUSR2, fatal)
    print("Running Firecracker v%s (test double) on %s" % (VERSION, sock))
    sys.stdout.flush()
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
