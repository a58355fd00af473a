"""Unit tests of the moat SDK against a fake gateway (fake_gateway.py):
request shapes, reply decoding (64-bit integers as strings, bytes as
base64), error mapping, and the adapters' callables and import errors.
No VMs, no network beyond 127.0.0.1."""

import base64
import os
import socket
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import moat  # noqa: E402
from moat.client import from_b64, to_int  # noqa: E402
from fake_gateway import FakeGateway  # noqa: E402


def b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


SANDBOX = {"id": "sb-1", "state": "SANDBOX_STATE_RUNNING",
           "memoryMib": 512, "vcpus": 1, "sessionId": "ses-1",
           "createdUnixMs": "1796227664932"}


class FakeTest(unittest.TestCase):
    def setUp(self):
        self.gw = FakeGateway()
        self.addCleanup(self.gw.close)
        self.client = moat.Client(self.gw.url, api_key="k-123", timeout=10)
        self.gw.on("CreateSandbox", (200, SANDBOX))
        self.gw.on("DestroySandbox", (200, {}))

    def sandbox(self, **kw):
        return moat.Sandbox(client=self.client, **kw)


class ClientTest(FakeTest):
    def test_url_and_key_from_environment(self):
        with mock.patch.dict(os.environ, {"MOAT_URL": self.gw.url,
                                          "MOAT_API_KEY": "env-key"}):
            c = moat.Client()
            self.assertEqual(c.url, self.gw.url)
            c.call("Info", {})
        h = self.gw.calls("Info")[0]["headers"]
        self.assertEqual(h["Authorization"], "Bearer env-key")

    def test_defaults_without_environment(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            c = moat.Client()
        self.assertEqual(c.url, "http://127.0.0.1:7780")
        self.assertIsNone(c.api_key)

    def test_request_shape(self):
        self.client.call("Info", {"a": 1}, timeout=2.5)
        r = self.gw.requests[0]
        self.assertEqual(r["path"], "/v1/rpc/Info")
        self.assertEqual(r["body"], {"a": 1})
        self.assertEqual(r["headers"]["Authorization"], "Bearer k-123")
        self.assertEqual(r["headers"]["Content-Type"], "application/json")
        self.assertEqual(r["headers"]["X-Moat-Timeout-Ms"], "12500")
        self.assertTrue(int(r["headers"]["X-Moat-Request-Id"]) > 0)

    def test_no_auth_header_without_key(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            moat.Client(self.gw.url).call("Info")
        self.assertNotIn("Authorization", self.gw.requests[0]["headers"])

    def test_int64_and_base64_helpers(self):
        self.assertEqual(to_int("18446744073709551615"), 2**64 - 1)
        self.assertEqual(to_int(None), 0)
        self.assertEqual(to_int(7), 7)
        self.assertEqual(from_b64(None), b"")
        self.assertEqual(from_b64(b64(b"\x00\xff\xfe")), b"\x00\xff\xfe")
        # URL-safe and unpadded forms are proto3 JSON too.
        self.assertEqual(from_b64("_-8"), b"\xff\xef")


class ErrorTest(FakeTest):
    def check(self, status, code, cls):
        self.gw.on("GetSandbox", (status, {"code": code,
                                           "message": "sandbox sb-x not "
                                           "found"}))
        with self.assertRaises(cls) as cm:
            moat.Sandbox.connect("sb-x", client=self.client)
        e = cm.exception
        self.assertIsInstance(e, moat.MoatError)
        self.assertEqual(e.code, code)
        self.assertEqual(e.http_status, status)
        self.assertIn("sandbox sb-x not found", e.message)
        return e

    def test_each_code_maps_to_its_class(self):
        cases = [(404, "NOT_FOUND", moat.NotFound),
                 (400, "INVALID_ARGUMENT", moat.InvalidArgument),
                 (412, "FAILED_PRECONDITION", moat.FailedPrecondition),
                 (503, "UNAVAILABLE", moat.Unavailable),
                 (401, "UNAUTHENTICATED", moat.Unauthenticated),
                 (403, "PERMISSION_DENIED", moat.PermissionDenied),
                 (429, "RESOURCE_EXHAUSTED", moat.ResourceExhausted),
                 (504, "DEADLINE_EXCEEDED", moat.DeadlineExceeded),
                 (409, "ALREADY_EXISTS", moat.AlreadyExists),
                 (409, "ABORTED", moat.Aborted),
                 (501, "UNIMPLEMENTED", moat.Unimplemented),
                 (500, "INTERNAL", moat.Internal),
                 (500, "DATA_LOSS", moat.DataLoss)]
        for status, code, cls in cases:
            with self.subTest(code=code):
                self.check(status, code, cls)

    def test_not_found_is_not_other_classes(self):
        e = self.check(404, "NOT_FOUND", moat.NotFound)
        self.assertNotIsInstance(e, moat.Unavailable)
        self.assertIn("NOT_FOUND", str(e))

    def test_non_json_error_body_uses_http_status(self):
        self.gw.on("Info", (502, b"<html>bad gateway</html>"))
        with self.assertRaises(moat.Unavailable) as cm:
            self.client.info()
        self.assertEqual(cm.exception.http_status, 502)
        self.assertIn("bad gateway", cm.exception.message)

    def test_non_json_success_body(self):
        self.gw.on("Info", (200, b"not json"))
        with self.assertRaises(moat.MoatError) as cm:
            self.client.info()
        self.assertIn("not JSON", str(cm.exception))

    def test_connection_refused_says_to_start_the_stack(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        c = moat.Client(f"http://127.0.0.1:{port}")
        with self.assertRaises(moat.Unavailable) as cm:
            c.info()
        e = cm.exception
        self.assertIsNone(e.http_status)
        self.assertIn("deploy/moat-stack start", e.message)
        self.assertIn("connection refused", e.message)

    def test_slow_gateway_is_deadline_exceeded(self):
        import time

        def slow(body):
            time.sleep(1.0)
            return 200, {}
        self.gw.on("Info", slow)
        c = moat.Client(self.gw.url, timeout=0.2)
        with self.assertRaises(moat.DeadlineExceeded):
            c.info()


class SandboxTest(FakeTest):
    def test_create_request_and_destroy_on_exit(self):
        with self.sandbox(cpus=2, memory=1024, record=True,
                          snapshot="every", image="python",
                          labels={"team": "x"}) as sb:
            self.assertEqual(sb.id, "sb-1")
            self.assertEqual(sb.session_id, "ses-1")
            self.assertEqual(self.gw.calls("DestroySandbox"), [])
        body = self.gw.calls("CreateSandbox")[0]["body"]
        self.assertEqual(body, {"vcpus": 2, "memoryMib": 1024,
                                "record": True,
                                "snapshotPolicy": "SNAPSHOT_POLICY_EVERY",
                                "image": "python",
                                "labels": {"team": "x"}})
        self.assertEqual(self.gw.calls("DestroySandbox")[0]["body"],
                         {"sandboxId": "sb-1"})

    def test_destroyed_when_the_block_raises(self):
        with self.assertRaises(RuntimeError):
            with self.sandbox():
                raise RuntimeError("boom")
        self.assertEqual(len(self.gw.calls("DestroySandbox")), 1)

    def test_destroy_of_a_gone_sandbox_is_quiet(self):
        self.gw.on("DestroySandbox", (404, {"code": "NOT_FOUND",
                                            "message": "gone"}))
        with self.sandbox():
            pass

    def test_snapshot_policies(self):
        for word, name in [("manual", "SNAPSHOT_POLICY_MANUAL"),
                           ("none", "SNAPSHOT_POLICY_NONE")]:
            self.sandbox(snapshot=word)
            self.assertEqual(
                self.gw.calls("CreateSandbox")[-1]["body"]["snapshotPolicy"],
                name)
        with self.assertRaises(ValueError):
            self.sandbox(snapshot="sometimes")

    def test_network_allowlist(self):
        self.sandbox(allow=["pypi.org", "files.pythonhosted.org:443"])
        self.assertEqual(
            self.gw.calls("CreateSandbox")[-1]["body"]["network"],
            {"mode": "allowlist",
             "allow": ["pypi.org", "files.pythonhosted.org:443"]})
        self.sandbox(network="allowlist")
        self.assertEqual(
            self.gw.calls("CreateSandbox")[-1]["body"]["network"],
            {"mode": "allowlist", "allow": []})
        self.sandbox()
        self.assertNotIn("network", self.gw.calls("CreateSandbox")[-1]["body"])
        with self.assertRaises(ValueError):
            self.sandbox(network="open")
        with self.assertRaises(ValueError):
            self.sandbox(network="none", allow=["pypi.org"])

    def test_connect(self):
        self.gw.on("GetSandbox", (200, SANDBOX))
        sb = moat.Sandbox.connect("sb-1", client=self.client)
        self.assertEqual(sb.id, "sb-1")
        self.assertEqual(self.gw.calls("GetSandbox")[0]["body"],
                         {"sandboxId": "sb-1"})
        self.assertEqual(self.gw.calls("CreateSandbox"), [])

    def test_run_code_decodes_result(self):
        self.gw.on("RunCode", (200, {
            "result": {"context": "ctx", "language": "python",
                       "stdout": b64("héllo\n"), "stderr": b64("warn\n"),
                       "result": "42", "hasResult": True,
                       "durationUs": "1234567", "executionCount": "3"},
            "stepIndex": 7, "sessionId": "ses-1"}))
        sb = self.sandbox()
        ex = sb.run_code("6*7", context="ctx", timeout=5)
        self.assertEqual(ex.stdout, "héllo\n")
        self.assertEqual(ex.stdout_bytes, "héllo\n".encode())
        self.assertEqual(ex.stderr, "warn\n")
        self.assertEqual(ex.result, "42")
        self.assertIsNone(ex.error)
        self.assertEqual(ex.step, 7)
        self.assertEqual(ex.duration_us, 1234567)
        self.assertEqual(ex.execution_count, 3)
        req = self.gw.calls("RunCode")[0]
        self.assertEqual(req["body"], {"sandboxId": "sb-1", "code": "6*7",
                                       "language": "python",
                                       "context": "ctx", "timeoutMs": 5000})
        # the call's deadline outlasts the run's own timeout
        self.assertEqual(req["headers"]["X-Moat-Timeout-Ms"], "15000")

    def test_run_code_error_and_no_result(self):
        self.gw.on("RunCode", (200, {"result": {
            "errorName": "ZeroDivisionError",
            "errorValue": "division by zero",
            "traceback": "Traceback ...\nZeroDivisionError: division by "
                         "zero\n", "result": ""}}))
        ex = self.sandbox().run_code("1/0")
        self.assertIsNone(ex.result)
        self.assertFalse(ex.ok)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertEqual(ex.error.value, "division by zero")
        self.assertIn("Traceback", ex.error.traceback)
        self.assertIsNone(ex.step)

    def test_run_code_rejects_bad_timeout(self):
        with self.assertRaises(ValueError):
            self.sandbox().run_code("1", timeout=0)

    def test_commands_shell_string(self):
        self.gw.on("Exec", (200, {"status": {"exited": True, "exitCode": 3,
                                             "durationMs": "12"},
                                  "stdout": b64(b"out\xff"),
                                  "stderr": b64("err")}))
        r = self.sandbox().commands.run("echo out; exit 3", cwd="/tmp",
                                        env={"A": "1"}, timeout=2)
        self.assertEqual(r.exit_code, 3)
        self.assertEqual(r.stdout_bytes, b"out\xff")
        self.assertEqual(r.stdout, "out\ufffd")
        self.assertEqual(r.stderr, "err")
        self.assertEqual(r.duration_ms, 12)
        self.assertFalse(r.ok)
        self.assertEqual(self.gw.calls("Exec")[0]["body"], {
            "sandboxId": "sb-1", "shell": "echo out; exit 3",
            "cwd": "/tmp", "env": ["A=1"], "timeoutMs": 2000})

    def test_commands_argv_and_zero_exit_left_out(self):
        self.gw.on("Exec", (200, {"status": {"exited": True},
                                  "stdout": b64("x")}))
        r = self.sandbox().commands.run(["ls", "-l", 3], stdin="in")
        self.assertEqual(r.exit_code, 0)
        self.assertTrue(r.ok)
        body = self.gw.calls("Exec")[0]["body"]
        self.assertEqual(body["argv"], ["ls", "-l", "3"])
        self.assertNotIn("shell", body)
        self.assertEqual(base64.b64decode(body["stdin"]), b"in")

    def test_files_read_in_pieces(self):
        self.gw.on("ReadFile",
                   (200, {"data": b64(b"abc"), "size": "6"}),
                   (200, {"data": b64(b"\x00ef"), "size": "6", "eof": True}))
        sb = self.sandbox()
        self.assertEqual(sb.files.read("/f"), b"abc\x00ef")
        calls = self.gw.calls("ReadFile")
        self.assertEqual(calls[0]["body"], {"sandboxId": "sb-1",
                                            "path": "/f", "offset": "0"})
        self.assertEqual(calls[1]["body"]["offset"], "3")

    def test_files_read_text_and_empty(self):
        self.gw.on("ReadFile", (200, {"eof": True}))
        self.assertEqual(self.sandbox().files.read_text("/empty"), "")

    def test_files_write(self):
        self.gw.on("WriteFile", (200, {"name": "a", "path": "/r/a",
                                       "size": "5", "mode": 420,
                                       "mtimeNs": "1796227664932893326",
                                       "type": "FILE_TYPE_REGULAR"}))
        info = self.sandbox().files.write("/r/a", "héllo")
        self.assertEqual(info.mtime_ns, 1796227664932893326)
        self.assertEqual(info.type, "file")
        body = self.gw.calls("WriteFile")[0]["body"]
        self.assertEqual(base64.b64decode(body["data"]), "héllo".encode())
        self.assertTrue(body["truncate"])
        self.assertTrue(body["makeParents"])
        self.assertEqual(body["mode"], 0o644)

    def test_files_write_large_goes_in_pieces(self):
        from moat import sandbox as sbmod
        data = bytes(range(256)) * 20
        with mock.patch.object(sbmod, "_WRITE_CHUNK", 2000):
            self.sandbox().files.write("/big", data)
        calls = self.gw.calls("WriteFile")
        self.assertEqual(len(calls), 3)
        self.assertTrue(calls[0]["body"]["truncate"])
        self.assertNotIn("truncate", calls[1]["body"])
        self.assertEqual(calls[1]["body"]["offset"], "2000")
        self.assertEqual(calls[2]["body"]["offset"], "4000")
        got = b"".join(base64.b64decode(c["body"]["data"]) for c in calls)
        self.assertEqual(got, data)

    def test_files_list(self):
        self.gw.on("ListFiles", (200, {"entries": [
            {"name": "d", "path": "/r/d", "type": "FILE_TYPE_DIRECTORY",
             "mode": 493},
            {"name": "f", "path": "/r/f", "size": "9000000000",
             "type": "FILE_TYPE_REGULAR"}]}))
        entries = self.sandbox().files.list("/r")
        self.assertEqual([e.name for e in entries], ["d", "f"])
        self.assertTrue(entries[0].is_dir)
        self.assertEqual(entries[1].size, 9000000000)
        self.assertEqual(entries[0].size, 0)

    def test_snapshot(self):
        self.gw.on("SnapshotSandbox", (200, {
            "snapshotId": "snap-vm-1", "sandboxId": "sb-1",
            "ramBytes": "100343808", "pauseMs": "196",
            "remoteStored": True}))
        s = self.sandbox().snapshot()
        self.assertEqual(s.id, "snap-vm-1")
        self.assertEqual(s.ram_bytes, 100343808)
        self.assertEqual(s.pause_ms, 196)
        self.assertEqual(self.gw.calls("SnapshotSandbox")[0]["body"],
                         {"sandboxId": "sb-1"})

    def test_history_pages_and_decodes(self):
        self.gw.on("ListSteps",
                   (200, {"steps": [{"sessionId": "ses-1", "index": "1",
                                     "kind": "STEP_KIND_CODE",
                                     "input": "x = 1",
                                     "snapshotId": "snap-a",
                                     "startedMs": "1796227677861"}],
                          "nextPageToken": "p2"}),
                   (200, {"steps": [{"sessionId": "ses-1", "index": "2",
                                     "kind": "STEP_KIND_EXEC",
                                     "exitCode": 2,
                                     "stdout": b64("o")}]}))
        steps = self.sandbox().history()
        self.assertEqual([s.index for s in steps], [1, 2])
        self.assertEqual(steps[0].kind, "code")
        self.assertEqual(steps[0].snapshot_id, "snap-a")
        self.assertEqual(steps[0].started_ms, 1796227677861)
        self.assertEqual(steps[1].kind, "exec")
        self.assertEqual(steps[1].exit_code, 2)
        self.assertEqual(steps[1].stdout, b"o")
        calls = self.gw.calls("ListSteps")
        self.assertEqual(calls[0]["body"], {"sessionId": "ses-1",
                                            "includeOutputs": True})
        self.assertEqual(calls[1]["body"]["pageToken"], "p2")

    def test_keep_pins_the_step(self):
        self.gw.on("Exec", (200, {"status": {"exited": True},
                                  "stepIndex": 3}))
        self.gw.on("RunCode", (200, {"result": {}, "stepIndex": 4}))
        sb = self.sandbox()
        sb.commands.run("make", keep=True)
        sb.commands.run("make test")
        sb.run_code("x = 1", keep=True)
        calls = self.gw.calls("Exec")
        self.assertIs(calls[0]["body"]["keep"], True)
        self.assertNotIn("keep", calls[1]["body"])
        self.assertIs(self.gw.calls("RunCode")[0]["body"]["keep"], True)

    def test_keep_step(self):
        self.gw.on("SetStepKeep", (200, {"sessionId": "ses-1",
                                         "index": "2", "keep": True}))
        st = self.sandbox().keep_step(2)
        self.assertTrue(st.keep)
        self.assertEqual(st.index, 2)
        self.assertEqual(self.gw.calls("SetStepKeep")[0]["body"], {
            "sessionId": "ses-1", "index": "2", "keep": True})

    def test_lifetimes_of_issue_15(self):
        sb = moat.Sandbox.create(client=self.client, timeout=30,
                                 idle_timeout=10)
        body = self.gw.calls("CreateSandbox")[0]["body"]
        self.assertEqual(body["timeoutS"], 30)
        self.assertEqual(body["idleTimeoutS"], 10)
        self.assertNotIn("bootTimeoutMs", body)
        self.gw.on("SetTimeout", (200, dict(SANDBOX,
                                            expiresUnixMs="1796227700000",
                                            idleTimeoutS=0)))
        sb.set_timeout(600, idle_timeout=0)
        self.assertEqual(self.gw.calls("SetTimeout")[0]["body"], {
            "sandboxId": "sb-1", "timeoutS": 600,
            "clearIdleTimeout": True})
        self.assertEqual(sb.expires_unix_ms, 1796227700000)
        self.assertEqual(sb.idle_timeout, 0)
        sb.keepalive()
        self.assertEqual(self.gw.calls("SetTimeout")[1]["body"],
                         {"sandboxId": "sb-1"})
        with self.assertRaises(ValueError):
            sb.set_timeout(0)

    def test_steps_and_snapshots_of_issue_11(self):
        self.gw.on("ListSteps", (200, {"steps": [
            {"index": "1", "keep": True, "snapshotId": "snap-a"},
            {"index": "2",
             "snapshotRemoved": "removed by retention (keep-last 3)"}]}))
        steps = self.sandbox().history(outputs=False)
        self.assertTrue(steps[0].keep)
        self.assertEqual(steps[1].snapshot_removed,
                         "removed by retention (keep-last 3)")
        self.assertFalse(steps[1].keep)
        self.gw.on("ListLocalSnapshots", (200, {"snapshots": [
            {"snapshotId": "snap-n-1", "location": "disk",
             "evictedTo": "snapd", "ramBytes": "3145728",
             "ramResidentBytes": "0", "sessionId": "ses-1", "step": "2",
             "lastUsedUnixMs": "1796227677861", "someFutureField": 1}]}))
        snaps = self.client.list_snapshots()
        self.assertEqual(snaps[0].location, "disk")
        self.assertEqual(snaps[0].evicted_to, "snapd")
        self.assertEqual(snaps[0].session_id, "ses-1")
        self.assertEqual(snaps[0].step, 2)
        self.assertEqual(snaps[0].last_used_unix_ms, 1796227677861)

    def test_gc_snapshots(self):
        self.gw.on("GcSnapshots", (200, {
            "dryRun": True, "bytesFreed": "3145728", "kept": 4,
            "removed": [{"snapshotId": "snap-n-1", "where": "node n",
                         "bytes": "2097152", "sandboxId": "sb-9"}],
            "errors": ["moat-snapd did not answer"]}))
        r = self.client.gc_snapshots(dry_run=True, min_age=120)
        self.assertEqual(self.gw.calls("GcSnapshots")[0]["body"],
                         {"dryRun": True, "minAgeS": 120})
        self.assertTrue(r.dry_run)
        self.assertEqual(r.bytes_freed, 3145728)
        self.assertEqual(r.kept, 4)
        self.assertEqual(r.removed[0]["bytes"], 2097152)
        self.assertEqual(r.removed[0]["where"], "node n")
        self.assertEqual(r.errors, ["moat-snapd did not answer"])
        self.client.gc_snapshots()
        self.assertEqual(self.gw.calls("GcSnapshots")[1]["body"],
                         {"dryRun": False})

    def test_history_of_unrecorded_sandbox(self):
        self.gw.on("CreateSandbox", (200, {"id": "sb-2"}))
        self.gw.on("GetSandbox", (200, {"id": "sb-2"}))
        with self.assertRaises(moat.FailedPrecondition) as cm:
            self.sandbox(record=False).history()
        self.assertIn("record=True", str(cm.exception))

    def test_restore_in_place(self):
        self.gw.on("RestoreStep", (200, {
            "sandbox": dict(SANDBOX, sessionId="ses-2"),
            "sessionId": "ses-2", "snapshotId": "snap-a"}))
        sb = self.sandbox()
        r = sb.restore(1)
        self.assertEqual(self.gw.calls("RestoreStep")[0]["body"], {
            "sessionId": "ses-1", "step": "1", "sandboxId": "sb-1"})
        self.assertEqual(r.session_id, "ses-2")
        self.assertEqual(r.snapshot_id, "snap-a")
        self.assertEqual(sb.session_id, "ses-2")
        self.assertEqual(sb.id, "sb-1")

    def test_restore_reseed(self):
        self.gw.on("RestoreStep", (200, {
            "sandbox": SANDBOX, "sessionId": "ses-2",
            "snapshotId": "snap-a"}))
        sb = self.sandbox()
        sb.restore(2, reseed=True)
        self.assertEqual(self.gw.calls("RestoreStep")[0]["body"], {
            "sessionId": "ses-1", "step": "2", "sandboxId": "sb-1",
            "reseed": True})

    def test_restore_and_fork_on_a_node(self):
        self.gw.on("RestoreStep", (200, {
            "sandbox": dict(SANDBOX, id="sb-9", nodeId="node-b"),
            "sessionId": "ses-2", "snapshotId": "snap-a"}))
        self.gw.on("Fork", (200, {"copies": [{"sandbox": {"id": "x"}}]}))
        sb = self.sandbox()
        sb.restore(1, node="node-b")
        self.assertEqual(self.gw.calls("RestoreStep")[0]["body"]["node"],
                         "node-b")
        sb.fork(1, 2, node="node-b")
        self.assertEqual(self.gw.calls("Fork")[0]["body"]["node"], "node-b")

    def test_branch_history_and_tree(self):
        # Issue 18: a branch's history starts with its inherited steps.
        self.gw.on("ListSteps", (200, {"steps": [
            {"sessionId": "ses-2", "index": "1",
             "heldBySession": "ses-1", "kind": "STEP_KIND_EXEC"},
            {"sessionId": "ses-2", "index": "2", "kind": "STEP_KIND_EXEC",
             "exitCode": 1}]}))
        self.gw.on("GetSessionTree", (200, {"nodes": [
            {"sessionId": "ses-1", "stepCount": "3", "ownSteps": "3",
             "firstStep": "1", "hasExit": True},
            {"sessionId": "ses-2", "parentSessionId": "ses-1",
             "depth": 1, "branchedAt": "1", "firstStep": "2",
             "stepCount": "2", "ownSteps": "1", "hasExit": True,
             "lastExitCode": 1},
            {"sessionId": "ses-3", "parentSessionId": "ses-2",
             "depth": 2, "branchedAt": "2", "firstStep": "3",
             "stepCount": "2"}]}))
        sb = self.sandbox()
        steps = sb.history(outputs=False)
        self.assertEqual([s.index for s in steps], [1, 2])
        self.assertTrue(steps[0].inherited)
        self.assertEqual(steps[0].held_by_session, "ses-1")
        self.assertFalse(steps[1].inherited)
        tree = sb.tree()
        self.assertEqual(self.gw.calls("GetSessionTree")[0]["body"],
                         {"sessionId": "ses-1"})
        self.assertEqual([n.session_id for n in tree],
                         ["ses-1", "ses-2", "ses-3"])
        self.assertEqual(tree[0].last_exit_code, 0)
        self.assertEqual(tree[1].branched_at, 1)
        self.assertEqual(tree[1].depth, 1)
        self.assertEqual(tree[1].last_exit_code, 1)
        self.assertEqual(tree[1].own_steps, 1)
        self.assertIsNone(tree[2].last_exit_code)
        self.assertEqual(tree[2].first_step, 3)
        self.assertEqual(len(self.client.session_tree("ses-2")), 3)

    def test_fork_reports_failed_copies(self):
        self.gw.on("Fork", (200, {
            "copies": [
                {"sandbox": {"id": "sb-f1"}, "sessionId": "ses-f1"},
                {"code": "RESOURCE_EXHAUSTED", "message": "no memory"},
                {"code": "OK", "sandbox": {"id": "sb-f3"},
                 "sessionId": "ses-f3"}],
            "succeeded": 2, "snapshotId": "snap-a"}))
        forks = self.sandbox().fork(1, 3)
        self.assertEqual([f.id for f in forks], ["sb-f1", "sb-f3"])
        self.assertEqual(forks[0].session_id, "ses-f1")
        self.assertEqual(len(forks.failed), 1)
        self.assertEqual(forks.failed[0].code, "RESOURCE_EXHAUSTED")
        self.assertIsInstance(forks.failed[0].error(),
                              moat.ResourceExhausted)
        self.assertEqual(forks.snapshot_id, "snap-a")
        self.assertEqual(self.gw.calls("Fork")[0]["body"], {
            "sessionId": "ses-1", "step": "1", "count": 3})

    def test_fork_with_no_copy_raises(self):
        self.gw.on("Fork", (200, {"copies": [
            {"code": "FAILED_PRECONDITION", "message": "no snapshot"}]}))
        with self.assertRaises(moat.FailedPrecondition):
            self.sandbox().fork(1, 1)

    def test_fork_latest_step(self):
        self.gw.on("ListSteps", (200, {"steps": [{"index": "1"},
                                                 {"index": "4"}]}))
        self.gw.on("Fork", (200, {"copies": [{"sandbox": {"id": "x"}}]}))
        self.sandbox().fork()
        self.assertEqual(self.gw.calls("Fork")[0]["body"]["step"], "4")

    def test_module_run_code_uses_throwaway_sandbox(self):
        self.gw.on("RunCode", (200, {"result": {"stdout": b64("1\n")}}))
        ex = moat.run_code("print(1)", client=self.client)
        self.assertEqual(ex.stdout, "1\n")
        body = self.gw.calls("CreateSandbox")[0]["body"]
        self.assertFalse(body["record"])
        self.assertEqual(len(self.gw.calls("DestroySandbox")), 1)

    def test_module_run_code_destroys_on_error(self):
        self.gw.on("RunCode", (503, {"code": "UNAVAILABLE",
                                     "message": "node gone"}))
        with self.assertRaises(moat.Unavailable):
            moat.run_code("1", client=self.client)
        self.assertEqual(len(self.gw.calls("DestroySandbox")), 1)


class ImagesTest(FakeTest):
    """client.images (issue 17): list, and build sending the spec and
    its [files] (mode kept) and yielding each step until done; a failed
    build raises its code's error."""

    def test_list(self):
        self.gw.on("ListImages", (200, {"images": [
            {"name": "default", "nodes": ["n1"], "stored": True}]}))
        imgs = self.client.images.list()
        self.assertEqual(imgs[0]["name"], "default")
        self.assertEqual(self.gw.calls("ListImages")[0]["body"],
                         {"name": ""})

    def test_build_yields_steps(self):
        import tempfile
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "hi.sh"), "w") as f:
            f.write("echo hi\n")
        os.chmod(os.path.join(d, "hi.sh"), 0o750)
        spec = os.path.join(d, "tools.ini")
        with open(spec, "w") as f:
            f.write("[packages]\njq =\n[files]\n/usr/bin/Hi = hi.sh\n")
        self.gw.on("StartImageBuild", (200, {"id": "b-1", "nodeId": "n1"}))
        self.gw.on("GetImageBuild",
                   (200, {"state": "IMAGE_BUILD_RUNNING", "nextStep": 1,
                          "steps": [{"text": "apt", "atMs": "5"}]}),
                   (200, {"state": "IMAGE_BUILD_DONE", "nextStep": 1,
                          "image": {"name": "tools"}}))
        steps = list(self.client.images.build(spec))
        self.assertEqual([s["text"] for s in steps], ["apt"])
        start = self.gw.calls("StartImageBuild")[0]["body"]
        self.assertEqual(start["name"], "tools")
        self.assertEqual(start["files"], [
            {"name": "hi.sh", "data": b64("echo hi\n"), "mode": 0o750}])
        polls = self.gw.calls("GetImageBuild")
        self.assertEqual([p["body"]["fromStep"] for p in polls], [0, 1])
        self.assertEqual(polls[0]["body"]["nodeId"], "n1")
        self.gw.on("GetImageBuild", (200, {
            "state": "IMAGE_BUILD_FAILED", "code": 9, "error": "no jq"}))
        with self.assertRaises(moat.FailedPrecondition) as cm:
            list(self.client.images.build(spec, name="x"))
        self.assertIn("no jq", str(cm.exception))


class IntegrationAdapterTest(FakeTest):
    def hide(self, *modules):
        # A None entry in sys.modules makes `import name` raise
        # ImportError, as when the package is not installed.
        return mock.patch.dict(sys.modules, {m: None for m in modules})

    def test_langchain_missing_package_message(self):
        from moat.integrations import langchain
        with self.hide("langchain_core", "langchain_core.tools"):
            with self.assertRaises(ImportError) as cm:
                langchain.sandbox_tool(client=self.client)
        msg = str(cm.exception)
        self.assertIn("pip install langchain-core", msg)
        self.assertIn("moat.integrations.langchain", msg)

    def test_openai_agents_missing_package_message(self):
        from moat.integrations import openai_agents
        with self.hide("agents"):
            with self.assertRaises(ImportError) as cm:
                openai_agents.sandbox_tool(client=self.client)
        msg = str(cm.exception)
        self.assertIn("pip install openai-agents", msg)
        self.assertIn("moat.integrations.openai_agents", msg)

    def test_adapters_use_the_framework_when_present(self):
        from moat.integrations import langchain, openai_agents
        tools = mock.MagicMock()
        agents = mock.MagicMock()
        with mock.patch.dict(sys.modules, {"langchain_core": mock.MagicMock(),
                                           "langchain_core.tools": tools,
                                           "agents": agents}):
            langchain.sandbox_tool(client=self.client, name="py")
            openai_agents.sandbox_tool(client=self.client, name="py")
        kw = tools.StructuredTool.from_function.call_args.kwargs
        self.assertEqual(kw["name"], "py")
        self.assertTrue(callable(kw["func"]))
        args, kw2 = agents.function_tool.call_args
        self.assertEqual(kw2["name_override"], "py")
        self.assertTrue(callable(args[0]))

    def test_code_runner_throwaway(self):
        from moat.integrations import code_runner
        self.gw.on("RunCode", (200, {"result": {"stdout": b64("hi\n"),
                                                "result": "3",
                                                "hasResult": True}}))
        out = code_runner(client=self.client)("print('hi'); 1+2")
        self.assertEqual(out, "hi\n3")
        self.assertEqual(len(self.gw.calls("DestroySandbox")), 1)

    def test_code_runner_in_a_sandbox_shows_traceback(self):
        from moat.integrations import code_runner
        self.gw.on("RunCode", (200, {"result": {
            "errorName": "NameError", "errorValue": "name 'y' is not "
            "defined", "traceback": "Traceback\nNameError: name 'y' is "
            "not defined\n"}}))
        sb = self.sandbox()
        out = code_runner(sb, context="agent")("y")
        self.assertIn("NameError: name 'y' is not defined", out)
        self.assertEqual(self.gw.calls("RunCode")[0]["body"]["context"],
                         "agent")
        self.assertEqual(self.gw.calls("DestroySandbox"), [])


if __name__ == "__main__":
    unittest.main()
