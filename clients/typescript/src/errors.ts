/**
 * errors.ts: the typed errors of the moat TypeScript SDK. Every failed
 * call is a MoatError whose `code` is the Connect Code name ("NotFound",
 * "Unauthenticated", ...) and whose `message` is the gateway's own text;
 * the common codes have subclasses to catch (NotFoundError, AuthError,
 * TimeoutError, RateLimitError, ...), as the Python SDK's errors.py has
 * one class per code. Not for: transports or retries (client.ts; callers
 * decide what to retry).
 */
import { Code, ConnectError } from "@connectrpc/connect";

/** The Connect Code names, e.g. "NotFound" (Code[Code.NotFound]). */
export type CodeName = keyof typeof Code;

/** A failed moat call. `code` is the Connect Code name, `codeNumber`
 * the number (gRPC's numbering, which moat's proto/common.proto Code
 * shares), `message` the gateway's message without a code prefix. */
export class MoatError extends Error {
  readonly code: CodeName;
  readonly codeNumber: Code;
  /** The ConnectError (or other error) this came from, when any. */
  readonly cause?: unknown;

  constructor(code: Code, message: string, cause?: unknown) {
    super(message);
    this.name = new.target.name;
    this.codeNumber = code;
    this.code = (Code[code] ?? "Unknown") as CodeName;
    this.cause = cause;
  }
}

/** NotFound: no such sandbox, session, step or file (or it was killed). */
export class NotFoundError extends MoatError {}
/** Unauthenticated: no API key, or one the gateway does not know. */
export class AuthError extends MoatError {}
/** PermissionDenied: the key may not do this (policy, another tenant). */
export class PermissionDeniedError extends MoatError {}
/** DeadlineExceeded: the call's deadline passed before an answer. */
export class TimeoutError extends MoatError {}
/** ResourceExhausted: a rate limit, quota or size cap. */
export class RateLimitError extends MoatError {}
/** InvalidArgument or OutOfRange: a request the gateway cannot take. */
export class InvalidArgumentError extends MoatError {}
/** FailedPrecondition: not possible in the current state (e.g. a step
 * without a snapshot, a sandbox that is not recorded). */
export class FailedPreconditionError extends MoatError {}
/** AlreadyExists. */
export class AlreadyExistsError extends MoatError {}
/** Aborted: a conflict (e.g. a concurrent restore); retry may work. */
export class AbortedError extends MoatError {}
/** Unavailable: no gateway answers at the address, or no node can serve. */
export class UnavailableError extends MoatError {}
/** Unimplemented: the gateway (or this door of it) lacks the method. */
export class UnimplementedError extends MoatError {}
/** Internal, Unknown or DataLoss: the server failed. */
export class InternalError extends MoatError {}
/** Canceled: the call was cancelled (an AbortSignal, a closed stream). */
export class CanceledError extends MoatError {}

const classes: Partial<Record<Code, new (c: Code, m: string, cause?: unknown) => MoatError>> = {
  [Code.NotFound]: NotFoundError,
  [Code.Unauthenticated]: AuthError,
  [Code.PermissionDenied]: PermissionDeniedError,
  [Code.DeadlineExceeded]: TimeoutError,
  [Code.ResourceExhausted]: RateLimitError,
  [Code.InvalidArgument]: InvalidArgumentError,
  [Code.OutOfRange]: InvalidArgumentError,
  [Code.FailedPrecondition]: FailedPreconditionError,
  [Code.AlreadyExists]: AlreadyExistsError,
  [Code.Aborted]: AbortedError,
  [Code.Unavailable]: UnavailableError,
  [Code.Unimplemented]: UnimplementedError,
  [Code.Internal]: InternalError,
  [Code.Unknown]: InternalError,
  [Code.DataLoss]: InternalError,
  [Code.Canceled]: CanceledError,
};

/** errorFor: the typed error of `code` (a Code or its number, e.g. a
 * ForkCopy's) carrying `message`. */
export function errorFor(code: Code | number, message: string, cause?: unknown): MoatError {
  const cls = classes[code as Code] ?? MoatError;
  return new cls(code as Code, message, cause);
}

/** toMoatError: any error a call threw as a MoatError: a ConnectError's
 * code and the server's message (rawMessage: without Connect's "[code]"
 * prefix); a refused or reset connection is Unavailable naming `where`
 * and what to do. MoatErrors pass through. */
export function toMoatError(err: unknown, where: string): MoatError {
  if (err instanceof MoatError) return err;
  if (err instanceof ConnectError) {
    const sys = systemCode(err.cause);
    if (sys && err.code === Code.Unavailable) {
      return errorFor(Code.Unavailable, unreachable(where, sys), err);
    }
    return errorFor(err.code, err.rawMessage, err);
  }
  const sys = systemCode(err);
  if (sys) return errorFor(Code.Unavailable, unreachable(where, sys), err);
  return errorFor(Code.Unknown, err instanceof Error ? err.message : String(err), err);
}

function systemCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === "string" && /^E[A-Z]+$/.test(code) ? code : undefined;
}

function unreachable(where: string, sys: string): string {
  return `no moat gateway answers at ${where} (${sys}): start one (deploy/moat-stack start) or point the SDK at it (the url option, MOAT_URL or MOAT_GRPC_URL)`;
}
