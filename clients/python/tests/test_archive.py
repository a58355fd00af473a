"""Unit tests of sb.files.upload_dir / download_dir (moat/archive.py,
issue 17) against the fake gateway (fake_gateway.py): the PUT and GET of
the files route's archive form (query, headers, the tar sent), the
summary, symlinks kept as links, and every unsafe archive refused before
anything is written (absolute and `..` names, device nodes, fifos, links
out of the directory, members under a symlink member, a name twice, a
symlink already on disk in the way, a body cut short). No VMs."""

import io
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import moat  # noqa: E402
from fake_gateway import FakeGateway  # noqa: E402

SANDBOX = {"id": "sb-1", "state": "SANDBOX_STATE_RUNNING"}


def tar_of(entries):
    """tar_of: an archive of (name, kind, data-or-target) entries; kind
    is file, dir, sym, link, chr or fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, arg in entries:
            info = tarfile.TarInfo(name)
            info.mode = 0o755 if kind == "dir" else 0o644
            data = None
            if kind == "file":
                data = io.BytesIO(arg)
                info.size = len(arg)
            else:
                info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                             "link": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE,
                             "fifo": tarfile.FIFOTYPE}[kind]
                if kind in ("sym", "link"):
                    info.linkname = arg
            t.addfile(info, data)
    return buf.getvalue()


class ArchiveTest(unittest.TestCase):
    def setUp(self):
        self.gw = FakeGateway()
        self.addCleanup(self.gw.close)
        self.client = moat.Client(self.gw.url, api_key="k-1", timeout=10)
        self.gw.on("CreateSandbox", (200, SANDBOX))
        self.sb = moat.Sandbox(client=self.client)
        self.tmp = tempfile.mkdtemp(prefix="moat-archive-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def local(self, *parts):
        return os.path.join(self.tmp, *parts)

    # ---- upload ----

    def test_upload_dir(self):
        src = self.local("src")
        os.makedirs(self.local("src", "a", "b"))
        os.makedirs(self.local("src", "empty"))
        with open(self.local("src", "a", "b", "f.txt"), "wb") as f:
            f.write(b"hello")
        with open(self.local("src", "top.bin"), "wb") as f:
            f.write(bytes(range(256)) * 4)
        os.symlink("a/b/f.txt", self.local("src", "link"))
        self.gw.on("PUT files", (200, {
            "uploadId": "up-1", "received": "4096", "done": True,
            "files": 2, "dirs": 3, "symlinks": 1, "bytes": "1029"}))
        got = self.sb.files.upload_dir(src, "/work/dst")
        self.assertEqual(got, moat.ArchiveSummary(files=2, dirs=3,
                                                  symlinks=1, bytes=1029))
        req = self.gw.calls("PUT files")[0]
        self.assertEqual(req["path"], "/v1/sandboxes/sb-1/files")
        self.assertEqual(req["query"], {"path": ["/work/dst"],
                                        "archive": ["tar"]})
        self.assertEqual(req["headers"]["Content-Type"], "application/x-tar")
        self.assertEqual(req["headers"]["Authorization"], "Bearer k-1")
        self.assertEqual(int(req["headers"]["Content-Length"]),
                         len(req["body"]))
        with tarfile.open(fileobj=io.BytesIO(req["body"])) as t:
            members = {m.name: m for m in t.getmembers()}
            self.assertEqual(sorted(members), [
                "a", "a/b", "a/b/f.txt", "empty", "link", "top.bin"])
            self.assertTrue(members["link"].issym())
            self.assertEqual(members["link"].linkname, "a/b/f.txt")
            self.assertEqual(t.extractfile("a/b/f.txt").read(), b"hello")

    def test_upload_refusals(self):
        with self.assertRaises(moat.InvalidArgument) as e:
            self.sb.files.upload_dir(self.local("nope"), "/d")
        self.assertIn("is not a directory", str(e.exception))
        os.makedirs(self.local("src"))
        os.mkfifo(self.local("src", "pipe"))
        with self.assertRaises(moat.InvalidArgument) as e:
            self.sb.files.upload_dir(self.local("src"), "/d")
        self.assertIn("pipe", str(e.exception))
        self.assertIn("fifo", str(e.exception))
        self.assertEqual(self.gw.calls("PUT files"), [])
        os.unlink(self.local("src", "pipe"))
        self.gw.on("PUT files", (413, {
            "code": "RESOURCE_EXHAUSTED",
            "message": "the archive is larger than [gateway] "
                       "archive-max-mib (1 MiB)"}))
        with self.assertRaises(moat.ResourceExhausted) as e:
            self.sb.files.upload_dir(self.local("src"), "/d")
        self.assertIn("upload_dir: the archive is larger", str(e.exception))
        self.assertEqual(e.exception.http_status, 413)

    # ---- download ----

    def test_download_dir(self):
        self.gw.on("GET files", (200, tar_of([
            ("./", "dir", None),
            ("./a", "dir", None),
            ("./a/b.txt", "file", b"bee"),
            ("./a/c", "dir", None),
            ("./a/c/d.bin", "file", b"\x00" * 5000),
            ("./hard", "link", "./a/b.txt"),
            ("./up", "sym", "a/c/../b.txt"),
            ("./a/c/back", "sym", "../b.txt"),
        ])))
        dst = self.local("out")
        got = self.sb.files.download_dir("/work/tree", dst)
        self.assertEqual(got, moat.ArchiveSummary(files=3, dirs=2,
                                                  symlinks=2, bytes=5003))
        req = self.gw.calls("GET files")[0]
        self.assertEqual(req["query"], {"path": ["/work/tree"],
                                        "archive": ["tar"]})
        with open(os.path.join(dst, "a", "b.txt"), "rb") as f:
            self.assertEqual(f.read(), b"bee")
        self.assertEqual(os.path.getsize(os.path.join(dst, "a", "c",
                                                      "d.bin")), 5000)
        self.assertEqual(os.readlink(os.path.join(dst, "up")),
                         "a/c/../b.txt")
        self.assertEqual(os.readlink(os.path.join(dst, "a", "c", "back")),
                         "../b.txt")
        with open(os.path.join(dst, "hard"), "rb") as f:
            self.assertEqual(f.read(), b"bee")

    def assert_refused(self, entries, want):
        self.gw.on("GET files", (200, tar_of(entries)))
        dst = self.local("refused")
        with self.assertRaises(moat.InvalidArgument) as e:
            self.sb.files.download_dir("/t", dst)
        self.assertIn(want, str(e.exception))
        self.assertIn("nothing was written", str(e.exception))
        self.assertFalse(os.path.exists(dst), "something was written")

    def test_download_refusals(self):
        ok = ("ok.txt", "file", b"fine")
        self.assert_refused([ok, ("/etc/passwd", "file", b"x")],
                            "absolute path")
        self.assert_refused([ok, ("a/../../x", "file", b"x")], "(..)")
        self.assert_refused([ok, ("../x", "dir", None)], "(..)")
        self.assert_refused([ok, ("dev", "chr", None)], "device node")
        self.assert_refused([ok, ("p", "fifo", None)], "fifo")
        self.assert_refused([ok, ("s", "sym", "/etc/passwd")],
                            "absolute path '/etc/passwd'")
        self.assert_refused([ok, ("d/s", "sym", "../../x")],
                            "out of the directory")
        self.assert_refused([ok, ("s", "sym", "."), ("s/x", "file", b"x")],
                            "under the symlink 's'")
        self.assert_refused([ok, ("s/x", "file", b"x"), ("s", "sym", ".")],
                            "under the symlink 's'")
        self.assert_refused([ok, ("ok.txt", "file", b"again")], "twice")
        self.assert_refused([ok, ("h", "link", "/etc/shadow")],
                            "absolute path")
        self.assert_refused([ok, ("h", "link", "nothere")],
                            "no file before it")
        # Every refusal above came before a single write.
        self.assertEqual(os.listdir(self.tmp), [])

    def test_download_symlink_on_disk(self):
        dst = self.local("out")
        os.makedirs(dst)
        os.makedirs(self.local("elsewhere"))
        os.symlink(self.local("elsewhere"), os.path.join(dst, "sub"))
        self.gw.on("GET files", (200, tar_of([
            ("first.txt", "file", b"1"), ("sub/x.txt", "file", b"x")])))
        with self.assertRaises(moat.InvalidArgument) as e:
            self.sb.files.download_dir("/t", dst)
        self.assertIn("is a symlink on this machine", str(e.exception))
        self.assertEqual(os.listdir(self.local("elsewhere")), [])
        self.assertEqual(sorted(os.listdir(dst)), ["sub"])

    def test_download_cut_short_and_errors(self):
        data = tar_of([("f", "file", b"x" * 3000)])
        self.gw.on("GET files", (200, data[:2048],
                                 {"Content-Length": str(len(data))}))
        dst = self.local("out")
        with self.assertRaises(moat.Unavailable) as e:
            self.sb.files.download_dir("/t", dst)
        self.assertIn("ended after 2048 of", str(e.exception))
        self.assertFalse(os.path.exists(dst))
        self.gw.on("GET files", (404, {
            "code": "NOT_FOUND", "message": "no such file: /t"}))
        with self.assertRaises(moat.NotFound) as e:
            self.sb.files.download_dir("/t", dst)
        self.assertIn("download_dir: no such file", str(e.exception))
        self.gw.on("GET files", (200, b"this is not a tar archive" * 40))
        with self.assertRaises(moat.InvalidArgument) as e:
            self.sb.files.download_dir("/t", dst)
        self.assertIn("does not read as tar", str(e.exception))
        self.assertFalse(os.path.exists(dst))

    def test_round_trip_modes(self):
        src = self.local("src")
        os.makedirs(os.path.join(src, "bin"))
        path = os.path.join(src, "bin", "run.sh")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(path, 0o4755)  # setuid: dropped on the way back
        self.gw.on("PUT files", lambda body: (200, {"done": True}))
        self.sb.files.upload_dir(src, "/d")
        body = self.gw.calls("PUT files")[0]["body"]
        self.gw.on("GET files", (200, body))
        dst = self.local("back")
        self.sb.files.download_dir("/d", dst)
        mode = stat.S_IMODE(os.stat(os.path.join(dst, "bin", "run.sh"))
                            .st_mode)
        self.assertEqual(mode, 0o755)


if __name__ == "__main__":
    unittest.main()
