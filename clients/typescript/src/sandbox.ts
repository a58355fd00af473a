/**
 * sandbox.ts: the E2B-like surface of the moat TypeScript SDK, as the
 * Python SDK's sandbox.py has it: Sandbox.create/connect, runCode in
 * persistent contexts, commands.run with output streamed to callbacks
 * (ExecStream, or ExecStart + ExecRead long polls where the door does not
 * serve ExecStream), files, and time travel through the recorded session
 * (snapshot, history, restore, fork), kill. Every call is one Gateway
 * method through Client.call. Not for: transports and error mapping
 * (client.ts, errors.ts).
 */
import { create } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { SnapshotPolicy, StepKind } from "../gen/session_pb.js";
import { ExecRequestSchema, type Sandbox as SandboxInfo, type ExecRequest, type ExecStatus, type LocalSnapshot } from "../gen/vm_pb.js";
import type { FileInfo as FileInfoMsg } from "../gen/guest_pb.js";
import { FileType } from "../gen/guest_pb.js";
import type { Step as StepMsg, SessionTreeNode } from "../gen/session_pb.js";
import { Client, type ClientOptions } from "./client.js";
import { MoatError, NotFoundError, errorFor } from "./errors.js";

/** Files go in pieces well under the gateway's 4 MiB message cap. */
const WRITE_CHUNK = 2 * 1024 * 1024;
/** One ExecRead long poll of the fallback, milliseconds. */
const POLL_WAIT_MS = 2000;
/** How much longer than its wait an ExecRead call may take. */
const POLL_CALL_MS = 30_000;

const policies = { manual: SnapshotPolicy.MANUAL, every: SnapshotPolicy.EVERY, none: SnapshotPolicy.NONE } as const;

function seconds(ms: number, name: string): number {
  if (!Number.isFinite(ms) || ms <= 0) throw new RangeError(`${name} must be a positive number of milliseconds, not ${ms}`);
  return Math.max(1, Math.ceil(ms / 1000));
}

function positiveMs(ms: number | undefined, name: string): number {
  if (ms === undefined) return 0;
  if (!Number.isFinite(ms) || ms <= 0 || ms > 0xffffffff) throw new RangeError(`${name} must be 1 to 4294967295 milliseconds, not ${ms}`);
  return Math.ceil(ms);
}

const utf8 = new TextDecoder("utf-8");

// ---- results ----

/** A finished command. A non-zero exit is a result, not an error;
 * `exitCode` is -1 when a signal killed it (`signal` says which). */
export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
  signal: number;
  timedOut: boolean;
  /** The recorded step it became (unary Exec on a recorded sandbox). */
  step?: number;
  /** Which way it ran: "exec" (one Exec call), "stream" (ExecStream),
   * "poll" (ExecStart + ExecRead). */
  via: "exec" | "stream" | "poll";
}

/** The exception a code run raised. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

/** One run of code in a context: `result` is the repr of the last
 * expression (undefined when there was none), `error` the exception. */
export interface Execution {
  stdout: string;
  stderr: string;
  result?: string;
  error?: ExecutionError;
  step?: number;
  context: string;
  language: string;
  timedOut: boolean;
  executionCount: number;
}

export interface FileInfo {
  name: string;
  path: string;
  size: number;
  mode: number;
  type: "file" | "dir" | "symlink" | "other" | "unknown";
}

/** A recorded step of a session (index from 1). `snapshotId` "": no
 * snapshot follows it, so it cannot be restored or forked from. */
export interface Step {
  sessionId: string;
  index: number;
  kind: "exec" | "code" | "file_write" | "shell" | "unknown";
  input: string;
  exitCode: number;
  stdout: Uint8Array;
  stderr: Uint8Array;
  snapshotId: string;
  keep: boolean;
  /** A branch's inherited step (issue 18): the session that holds it;
   * "" for the session's own steps. */
  heldBySession: string;
}

export interface Restored {
  sandboxId: string;
  sessionId: string;
  snapshotId: string;
}

/** The sandboxes a fork started, and the copies that did not. */
export interface ForkResult extends Array<Sandbox> {
  failed: MoatError[];
  snapshotId: string;
}

function fileInfo(f: FileInfoMsg): FileInfo {
  const types: Record<number, FileInfo["type"]> = {
    [FileType.REGULAR]: "file",
    [FileType.DIRECTORY]: "dir",
    [FileType.SYMLINK]: "symlink",
    [FileType.OTHER]: "other",
  };
  return { name: f.name, path: f.path, size: Number(f.size), mode: f.mode, type: types[f.type] ?? "unknown" };
}

function step(s: StepMsg): Step {
  const kinds: Record<number, Step["kind"]> = { [StepKind.EXEC]: "exec", [StepKind.CODE]: "code", [StepKind.FILE_WRITE]: "file_write", [StepKind.SHELL]: "shell" };
  return {
    sessionId: s.sessionId,
    index: Number(s.index),
    kind: kinds[s.kind] ?? "unknown",
    input: s.input,
    exitCode: s.exitCode,
    stdout: s.stdout,
    stderr: s.stderr,
    snapshotId: s.snapshotId,
    keep: s.keep,
    heldBySession: s.heldBySession,
  };
}

function commandResult(st: ExecStatus | undefined, out: Uint8Array, err: Uint8Array, via: CommandResult["via"], stepIndex?: number): CommandResult {
  const r: CommandResult = {
    exitCode: st?.exitCode ?? 0,
    stdout: utf8.decode(out),
    stderr: utf8.decode(err),
    stdoutBytes: out,
    stderrBytes: err,
    signal: st?.signal ?? 0,
    timedOut: st?.timedOut ?? false,
    via,
  };
  if (stepIndex) r.step = stepIndex;
  return r;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** notServed: whether `err` says the door does not serve ExecStream (as
 * opposed to the command failing): Unimplemented (gRPC, or a Connect 404),
 * or the HTTP status of a door that refuses the streaming content type
 * (415), which connect-es reports as Unknown "HTTP 415". */
function notServed(err: unknown): boolean {
  if (!(err instanceof MoatError)) return false;
  if (err.codeNumber === Code.Unimplemented) return true;
  return err.codeNumber === Code.Unknown && /^HTTP (404|405|415)$/.test(err.message);
}

// ---- commands ----

export interface RunOptions {
  /** Each piece of stdout as it comes (text; a multi-byte character
   * split between pieces is kept whole). */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  /** The command's own timeout: it is killed after it (timedOut set). */
  timeoutMs?: number;
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** How to run it. "exec": one Exec call (output at the end; on a
   * recorded sandbox it becomes a step); "stream": ExecStream; "poll":
   * ExecStart + ExecRead long polls; "auto" (the default): "exec" without
   * callbacks, else ExecStream, falling back to polls where the door
   * answers that it does not serve ExecStream. Streamed and polled
   * commands are not recorded steps (the gateway records Exec only). */
  via?: "auto" | "exec" | "stream" | "poll";
  signal?: AbortSignal;
}

/** sandbox.commands: processes in the sandbox. */
export class Commands {
  constructor(private readonly sb: Sandbox) {}

  /** run: runs `cmd` to its end: a string under /bin/sh, an array as the
   * argv itself; output goes to onStdout/onStderr as it comes. */
  async run(cmd: string | string[], opts: RunOptions = {}): Promise<CommandResult> {
    const req = this.request(cmd, opts);
    const c = this.sb.client;
    let via = opts.via ?? "auto";
    if (via === "auto") {
      if (!opts.onStdout && !opts.onStderr) via = "exec";
      else if (c.exec !== "auto") via = c.exec;
      else via = c.streamServed === false ? "poll" : "stream";
    }
    if (via === "exec") {
      const r = await c.call((g) => g.exec(req, c.opts(req.timeoutMs || undefined, opts.signal)));
      return commandResult(r.status, r.stdout, r.stderr, "exec", r.stepIndex);
    }
    if (via === "poll") return this.poll(req, opts);
    const sink = new Sink(opts);
    try {
      const st = await this.stream(req, opts, sink);
      c.streamServed = true;
      return commandResult(st, concat(sink.out), concat(sink.err), "stream");
    } catch (err) {
      // Only before anything came: the command has not started then.
      if (opts.via !== "stream" && c.exec !== "stream" && !sink.any && notServed(err)) {
        c.streamServed = false;
        return this.poll(req, opts);
      }
      throw err;
    }
  }

  private request(cmd: string | string[], opts: RunOptions): ExecRequest {
    const req = create(ExecRequestSchema, { sandboxId: this.sb.id });
    if (typeof cmd === "string") req.shell = cmd;
    else {
      if (cmd.length === 0) throw new TypeError("commands.run: an empty argv: give a command");
      req.argv = cmd.map(String);
    }
    if (opts.cwd) req.cwd = opts.cwd;
    if (opts.env) req.env = Object.entries(opts.env).map(([k, v]) => `${k}=${v}`);
    if (opts.stdin !== undefined) req.stdin = typeof opts.stdin === "string" ? new TextEncoder().encode(opts.stdin) : opts.stdin;
    req.timeoutMs = positiveMs(opts.timeoutMs, "timeoutMs");
    return req;
  }

  private async stream(req: ExecRequest, opts: RunOptions, sink: Sink): Promise<ExecStatus | undefined> {
    const c = this.sb.client;
    return c.call(async (g) => {
      let status: ExecStatus | undefined;
      for await (const ev of g.execStream(req, c.opts(req.timeoutMs || undefined, opts.signal))) {
        const e = ev.event;
        if (e.case === "stdout") sink.stdout(e.value);
        else if (e.case === "stderr") sink.stderr(e.value);
        else if (e.case === "exit") status = e.value;
        else if (e.case === "started") sink.any = true;
      }
      if (!status) throw errorFor(Code.Internal, `ExecStream in sandbox ${this.sb.id} ended without the command's exit status`);
      return status;
    });
  }

  private async poll(req: ExecRequest, opts: RunOptions): Promise<CommandResult> {
    const c = this.sb.client;
    const sink = new Sink(opts);
    const h = await c.call((g) => g.execStart(req, c.opts(POLL_CALL_MS, opts.signal)));
    let stdoutOffset = 0n;
    let stderrOffset = 0n;
    for (;;) {
      const r = await c.call((g) =>
        g.execRead(
          { sandboxId: h.sandboxId || this.sb.id, execId: h.execId, stdoutOffset, stderrOffset, waitMs: POLL_WAIT_MS },
          c.opts(POLL_WAIT_MS + POLL_CALL_MS, opts.signal),
        ),
      );
      if (r.stdout.length) sink.stdout(r.stdout);
      if (r.stderr.length) sink.stderr(r.stderr);
      stdoutOffset = r.stdoutNext;
      stderrOffset = r.stderrNext;
      if (r.eof) return commandResult(r.status, concat(sink.out), concat(sink.err), "poll");
    }
  }
}

/** Sink: a command's output as it comes, kept and passed on as text. */
class Sink {
  out: Uint8Array[] = [];
  err: Uint8Array[] = [];
  any = false;
  private readonly dOut = new TextDecoder("utf-8");
  private readonly dErr = new TextDecoder("utf-8");
  constructor(private readonly opts: RunOptions) {}

  stdout(b: Uint8Array): void {
    this.any = true;
    this.out.push(b);
    const s = this.dOut.decode(b, { stream: true });
    if (s && this.opts.onStdout) this.opts.onStdout(s);
  }

  stderr(b: Uint8Array): void {
    this.any = true;
    this.err.push(b);
    const s = this.dErr.decode(b, { stream: true });
    if (s && this.opts.onStderr) this.opts.onStderr(s);
  }
}

// ---- files ----

/** sandbox.files: the sandbox's filesystem. */
export class Files {
  constructor(private readonly sb: Sandbox) {}

  /** read: the whole file at `path`, in as many ReadFile calls as it
   * takes. */
  async read(path: string): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    let offset = 0n;
    for (;;) {
      const r = await this.sb.client.call((g) => g.readFile({ sandboxId: this.sb.id, path, offset }));
      parts.push(r.data);
      offset += BigInt(r.data.length);
      if (r.eof || r.data.length === 0 || offset >= r.size) return concat(parts);
    }
  }

  /** readText: the file at `path` as UTF-8 text. */
  async readText(path: string): Promise<string> {
    return utf8.decode(await this.read(path));
  }

  /** write: replaces the file at `path` with `data` (a string is written
   * as UTF-8), creating missing directories; large data in pieces. */
  async write(path: string, data: string | Uint8Array, opts: { mode?: number } = {}): Promise<FileInfo> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    let offset = 0;
    for (;;) {
      const piece = bytes.subarray(offset, offset + WRITE_CHUNK);
      const r = await this.sb.client.call((g) =>
        g.writeFile({
          sandboxId: this.sb.id,
          path,
          data: piece,
          mode: opts.mode ?? 0o644,
          makeParents: true,
          truncate: offset === 0,
          offset: BigInt(offset),
        }),
      );
      offset += piece.length;
      if (offset >= bytes.length) return fileInfo(r);
    }
  }

  /** list: the entries of directory `path`. */
  async list(path = "/", opts: { recursive?: boolean } = {}): Promise<FileInfo[]> {
    const r = await this.sb.client.call((g) => g.listFiles({ sandboxId: this.sb.id, path, recursive: opts.recursive ?? false }));
    return r.entries.map(fileInfo);
  }

  /** stat: what is at `path` (NotFoundError when nothing is). */
  async stat(path: string): Promise<FileInfo> {
    return fileInfo(await this.sb.client.call((g) => g.statFile({ sandboxId: this.sb.id, path })));
  }

  /** exists: whether anything is at `path`. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** remove: deletes `path` (a directory only with recursive). */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.sb.client.call((g) => g.removeFile({ sandboxId: this.sb.id, path, recursive: opts.recursive ?? false }));
  }

  /** makeDir: creates directory `path` and its parents. */
  async makeDir(path: string): Promise<FileInfo> {
    return fileInfo(await this.sb.client.call((g) => g.makeDir({ sandboxId: this.sb.id, path, parents: true, mode: 0o755 })));
  }
}

// ---- the sandbox ----

export interface CreateOptions extends ClientOptions {
  /** A Client to share (else one is made from the ClientOptions). */
  client?: Client;
  /** The sandbox's lifetime: the node destroys it this long after
   * creation (rounded up to seconds; none: the tenant's default). */
  timeoutMs?: number;
  /** Destroyed after this long without a call (none: the tenant's). */
  idleTimeoutMs?: number;
  /** How long to wait for the boot (none: the node's default). */
  bootTimeoutMs?: number;
  /** Keep a session of every Exec and code run (history, restore,
   * fork). Default true. */
  record?: boolean;
  /** The recording's snapshots: "manual" (default: snapshot() after a
   * step makes it restorable), "every" step, or "none". */
  snapshot?: "manual" | "every" | "none";
  image?: string;
  cpus?: number;
  memoryMib?: number;
  labels?: Record<string, string>;
  /** "none" (default: no network) or "allowlist" with `allow`. */
  network?: "none" | "allowlist";
  allow?: string[];
  nodeSelector?: Record<string, string>;
  coldBoot?: boolean;
}

/** A microVM. Sandbox.create() makes one (and waits until it runs),
 * Sandbox.connect(id) attaches to one that exists. */
export class Sandbox {
  readonly client: Client;
  readonly commands: Commands;
  readonly files: Files;
  info: SandboxInfo;
  /** The recorded session it records into now ("" when not recorded). */
  sessionId: string;

  private constructor(client: Client, info: SandboxInfo) {
    this.client = client;
    this.info = info;
    this.sessionId = info.sessionId;
    this.commands = new Commands(this);
    this.files = new Files(this);
  }

  get id(): string {
    return this.info.id;
  }

  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const client = opts.client ?? new Client(opts);
    const snap = opts.snapshot ?? "manual";
    if (!(snap in policies)) throw new TypeError(`snapshot must be "manual", "every" or "none", not ${JSON.stringify(snap)}`);
    const allow = opts.allow ?? [];
    const mode = opts.network ?? (allow.length ? "allowlist" : undefined);
    if (mode === "none" && allow.length) throw new TypeError('allow needs network: "allowlist" (or leave network unset)');
    const boot = positiveMs(opts.bootTimeoutMs, "bootTimeoutMs");
    const info = await client.call((g) =>
      g.createSandbox(
        {
          vcpus: opts.cpus ?? 0,
          memoryMib: opts.memoryMib ?? 0,
          image: opts.image ?? "",
          labels: opts.labels ?? {},
          record: opts.record ?? true,
          snapshotPolicy: policies[snap],
          coldBoot: opts.coldBoot ?? false,
          nodeSelector: opts.nodeSelector ?? {},
          network: mode ? { mode, allow } : undefined,
          bootTimeoutMs: boot,
          timeoutS: opts.timeoutMs !== undefined ? seconds(opts.timeoutMs, "timeoutMs") : 0,
          idleTimeoutS: opts.idleTimeoutMs !== undefined ? seconds(opts.idleTimeoutMs, "idleTimeoutMs") : 0,
        },
        client.opts(boot || undefined),
      ),
    );
    return new Sandbox(client, info);
  }

  /** connect: the running sandbox `id` (NotFoundError when this key's
   * tenant has none by that id). */
  static async connect(id: string, opts: ClientOptions & { client?: Client } = {}): Promise<Sandbox> {
    const client = opts.client ?? new Client(opts);
    return new Sandbox(client, await client.call((g) => g.getSandbox({ sandboxId: id })));
  }

  /** list: the tenant's sandboxes, as the gateway describes them. */
  static async list(opts: ClientOptions & { client?: Client } = {}): Promise<SandboxInfo[]> {
    const client = opts.client ?? new Client(opts);
    return (await client.call((g) => g.listSandboxes({}))).sandboxes;
  }

  /** refresh: re-reads the sandbox (state, session) from the gateway. */
  async refresh(): Promise<SandboxInfo> {
    this.info = await this.client.call((g) => g.getSandbox({ sandboxId: this.id }));
    if (this.info.sessionId) this.sessionId = this.info.sessionId;
    return this.info;
  }

  /** kill: destroys the sandbox; one already gone is not an error. */
  async kill(): Promise<void> {
    try {
      await this.client.call((g) => g.destroySandbox({ sandboxId: this.id }));
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
  }

  /** runCode: runs `code` in the named persistent context (variables
   * and imports stay for the next run). An exception in the code is the
   * result's `error`, not a throw. */
  async runCode(code: string, opts: { language?: string; context?: string; timeoutMs?: number } = {}): Promise<Execution> {
    const timeoutMs = positiveMs(opts.timeoutMs, "timeoutMs");
    const r = await this.client.call((g) =>
      g.runCode(
        { sandboxId: this.id, code, language: opts.language ?? "python", context: opts.context ?? "default", timeoutMs },
        this.client.opts(timeoutMs || undefined),
      ),
    );
    const c = r.result;
    const ex: Execution = {
      stdout: utf8.decode(c?.stdout ?? new Uint8Array()),
      stderr: utf8.decode(c?.stderr ?? new Uint8Array()),
      context: c?.context || "default",
      language: c?.language || "python",
      timedOut: c?.timedOut ?? false,
      executionCount: Number(c?.executionCount ?? 0n),
    };
    if (c?.hasResult) ex.result = c.result;
    if (c?.errorName) ex.error = { name: c.errorName, value: c.errorValue, traceback: c.traceback };
    if (r.stepIndex) ex.step = r.stepIndex;
    return ex;
  }

  /** snapshot: pauses, snapshots and resumes the sandbox; on a recorded
   * "manual" session it becomes the latest step's snapshot. */
  async snapshot(): Promise<LocalSnapshot> {
    return this.client.call((g) => g.snapshotSandbox({ sandboxId: this.id }));
  }

  private async session(what: string): Promise<string> {
    if (!this.sessionId) await this.refresh();
    if (!this.sessionId) throw errorFor(Code.FailedPrecondition, `${what}: sandbox ${this.id} is not recorded: create it with Sandbox.create({ record: true })`);
    return this.sessionId;
  }

  /** history: the steps of this sandbox's session (or `sessionId`),
   * oldest first. */
  async history(opts: { sessionId?: string; outputs?: boolean } = {}): Promise<Step[]> {
    const sessionId = opts.sessionId ?? (await this.session("history"));
    const steps: Step[] = [];
    let pageToken = "";
    do {
      const r = await this.client.call((g) => g.listSteps({ sessionId, includeOutputs: opts.outputs ?? true, pageToken }));
      steps.push(...r.steps.map(step));
      pageToken = r.nextPageToken;
    } while (pageToken);
    return steps;
  }

  /** tree: this sandbox's session (or `sessionId`) and the branches
   * made from it (restores, forks), depth first: where each branched,
   * its step count, its last exit status (issue 18). */
  async tree(opts: { sessionId?: string } = {}): Promise<SessionTreeNode[]> {
    const sessionId = opts.sessionId ?? (await this.session("tree"));
    const r = await this.client.call((g) => g.getSessionTree({ sessionId }));
    return r.nodes;
  }

  /** restore: brings this sandbox back, in place, to the state after
   * step `stepIndex` (0: before the first) of its session (or
   * `sessionId`); it then records into a new branch session. The code
   * contexts keep their recorded random state unless `reseed` (a fork
   * or a restore into a new sandbox always reseeds). */
  async restore(stepIndex: number, opts: { sessionId?: string; reseed?: boolean } = {}): Promise<Restored> {
    const sessionId = opts.sessionId ?? (await this.session("restore"));
    const r = await this.client.call((g) => g.restoreStep({ sessionId, step: BigInt(stepIndex), sandboxId: this.id, reseed: opts.reseed ?? false }));
    if (r.sandbox) this.info = r.sandbox;
    if (r.sessionId) this.sessionId = r.sessionId;
    return { sandboxId: r.sandbox?.id ?? this.id, sessionId: r.sessionId, snapshotId: r.snapshotId };
  }

  /** fork: `count` (1 to 16) new sandboxes, each in the state after step
   * `stepIndex` (undefined: the latest) of this sandbox's session, each
   * recording its own branch. Throws only when none started; the copies
   * that did not are in `.failed`. Kill them when done. */
  async fork(stepIndex?: number, count = 1, opts: { sessionId?: string; labels?: Record<string, string> } = {}): Promise<ForkResult> {
    const sessionId = opts.sessionId ?? (await this.session("fork"));
    if (stepIndex === undefined) {
      const steps = await this.history({ sessionId, outputs: false });
      const last = steps.at(-1);
      if (!last) throw errorFor(Code.FailedPrecondition, `fork: session ${sessionId} has no steps yet`);
      stepIndex = last.index;
    }
    const at = stepIndex;
    const r = await this.client.call((g) => g.fork({ sessionId, step: BigInt(at), count, labels: opts.labels ?? {} }));
    const started: Sandbox[] = [];
    const failed: MoatError[] = [];
    for (const copy of r.copies) {
      if (copy.code === 0 && copy.sandbox) {
        const sb = new Sandbox(this.client, copy.sandbox);
        if (copy.sessionId) sb.sessionId = copy.sessionId;
        started.push(sb);
      } else {
        failed.push(errorFor(copy.code, copy.message));
      }
    }
    if (started.length === 0) throw failed[0] ?? errorFor(Code.Internal, `fork of session ${sessionId} step ${at}: the gateway returned no copies`);
    return Object.assign(started, { failed, snapshotId: r.snapshotId });
  }
}
