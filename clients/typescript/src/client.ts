/**
 * client.ts: one connection to a moat gateway. It makes the transport
 * (Connect over HTTP/1.1 to the HTTP door by default, or gRPC over
 * HTTP/2 to the gRPC door, or gRPC-Web to the HTTP door), adds the API
 * key and a request id to every call, and turns every failure into a
 * typed MoatError (errors.ts). `client.gateway` is the generated
 * moat.v1.Gateway client for any method the Sandbox class does not wrap.
 * Not for: sandbox objects (sandbox.ts) or the generated messages
 * (gen/, made by generate.sh).
 */
import { randomBytes } from "node:crypto";
import { createClient, type Client as RpcClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { Gateway } from "../gen/gateway_pb.js";
import { toMoatError } from "./errors.js";

/** The wire protocols a gateway speaks: "connect" and "grpc-web" on its
 * HTTP door (HTTP/1.1, default 127.0.0.1:7780), "grpc" on its gRPC door
 * (HTTP/2 cleartext, `moat-gateway --grpc`, 127.0.0.1:7781). */
export type Protocol = "connect" | "grpc" | "grpc-web";

export const DEFAULT_URL = "http://127.0.0.1:7780";
export const DEFAULT_GRPC_URL = "http://127.0.0.1:7781";

/** Seconds added to an operation's own timeout (a command's, a code
 * run's) for the call's deadline: the gateway must answer with the timed
 * out result, not a DEADLINE_EXCEEDED of its own. */
const DEADLINE_MARGIN_MS = 10_000;

export interface ClientOptions {
  /** The door's base URL. Default: $MOAT_URL (as the Python SDK and the
   * CLI read it), else http://127.0.0.1:7780; for protocol "grpc"
   * $MOAT_GRPC_URL, else http://127.0.0.1:7781. */
  url?: string;
  /** Sent as `Authorization: Bearer KEY`. Default: $MOAT_API_KEY. */
  apiKey?: string;
  /** Default "connect". */
  protocol?: Protocol;
  /** Connect and gRPC-Web: binary protobuf (default true) or JSON. */
  binary?: boolean;
  /** A transport of your own (then url and protocol only name it). */
  transport?: Transport;
  /** How commands.run streams its output by default: "auto" (ExecStream,
   * or ExecStart + ExecRead polls where the door does not serve
   * ExecStream), "stream" (ExecStream only) or "poll" (never
   * ExecStream). */
  exec?: "auto" | "stream" | "poll";
}

export interface CallOptions {
  /** The call's deadline, milliseconds (none: the gateway's). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

function envOf(name: string): string | undefined {
  const v = process.env[name];
  return v === undefined || v === "" ? undefined : v;
}

function withScheme(url: string): string {
  return (url.includes("://") ? url : `http://${url}`).replace(/\/+$/, "");
}

/** A gateway connection: share one between sandboxes. */
export class Client {
  readonly url: string;
  readonly protocol: Protocol;
  readonly gateway: RpcClient<typeof Gateway>;
  readonly exec: "auto" | "stream" | "poll";
  /** Whether this door served ExecStream (undefined: not tried yet). */
  streamServed: boolean | undefined;
  private readonly apiKey: string | undefined;

  constructor(opts: ClientOptions = {}) {
    this.protocol = opts.protocol ?? "connect";
    if (!["connect", "grpc", "grpc-web"].includes(this.protocol)) {
      throw new TypeError(`protocol must be "connect", "grpc" or "grpc-web", not ${JSON.stringify(this.protocol)}`);
    }
    const fallback = this.protocol === "grpc" ? (envOf("MOAT_GRPC_URL") ?? DEFAULT_GRPC_URL) : (envOf("MOAT_URL") ?? DEFAULT_URL);
    this.url = withScheme(opts.url ?? fallback);
    this.apiKey = opts.apiKey ?? envOf("MOAT_API_KEY");
    this.exec = opts.exec ?? "auto";
    const transport = opts.transport ?? this.makeTransport(opts.binary ?? true);
    this.gateway = createClient(Gateway, transport);
  }

  private makeTransport(binary: boolean): Transport {
    const interceptors: Interceptor[] = [
      (next) => async (req) => {
        if (this.apiKey) req.header.set("authorization", `Bearer ${this.apiKey}`);
        // The idempotency key of mutating calls, one per call (as the
        // Python SDK's X-Moat-Request-Id).
        req.header.set("x-moat-request-id", (randomBytes(8).readBigUInt64BE() >> 1n || 1n).toString());
        return next(req);
      },
    ];
    switch (this.protocol) {
      case "grpc":
        return createGrpcTransport({ baseUrl: this.url, interceptors });
      case "grpc-web":
        return createGrpcWebTransport({ baseUrl: this.url, httpVersion: "1.1", useBinaryFormat: binary, interceptors });
      default:
        return createConnectTransport({ baseUrl: this.url, httpVersion: "1.1", useBinaryFormat: binary, interceptors });
    }
  }

  /** call: runs `fn` (a call on `this.gateway`) and turns its failure
   * into a MoatError. */
  async call<T>(fn: (rpc: RpcClient<typeof Gateway>) => Promise<T>): Promise<T> {
    try {
      return await fn(this.gateway);
    } catch (err) {
      throw toMoatError(err, `${this.url} (${this.protocol})`);
    }
  }

  /** opts: the connect-es call options of an operation that itself runs
   * up to `opTimeoutMs` (undefined: the gateway's defaults). */
  opts(opTimeoutMs?: number, signal?: AbortSignal): { timeoutMs?: number; signal?: AbortSignal } {
    const o: { timeoutMs?: number; signal?: AbortSignal } = {};
    if (opTimeoutMs !== undefined && opTimeoutMs > 0) o.timeoutMs = opTimeoutMs + DEADLINE_MARGIN_MS;
    if (signal) o.signal = signal;
    return o;
  }
}
