/**
 * index.ts: the public entry of @moat/sdk: the Sandbox surface
 * (sandbox.ts), the Client and its transports (client.ts), the typed
 * errors (errors.ts), and the generated messages and service of
 * proto/ for calls the Sandbox class does not wrap. Not for: code of its
 * own.
 */
export { Client, DEFAULT_URL, DEFAULT_GRPC_URL, type ClientOptions, type CallOptions, type Protocol } from "./client.js";
export {
  Sandbox,
  Commands,
  Files,
  type CreateOptions,
  type RunOptions,
  type CommandResult,
  type Execution,
  type ExecutionError,
  type FileInfo,
  type Step,
  type Restored,
  type ForkResult,
} from "./sandbox.js";
export * from "./errors.js";
export { Gateway } from "../gen/gateway_pb.js";
export * as vm from "../gen/vm_pb.js";
export * as session from "../gen/session_pb.js";
export * as guest from "../gen/guest_pb.js";
export * as common from "../gen/common_pb.js";
