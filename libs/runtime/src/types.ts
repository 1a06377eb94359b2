/** What to run. Mirrors the parts of a pod spec the data-plane workloads need. */
export interface WorkloadSpec {
  /** Unique among running workloads (e.g. `backing-image-ds-<bi>`, `bim-<hash>`). */
  name: string;
  labels?: Record<string, string>;
  /** Executable (absolute path or looked up in PATH). */
  command: string;
  args?: string[];
  /** Added to (not replacing) the runtime's base environment. */
  env?: Record<string, string>;
  cwd?: string;
  /** stdout and stderr go here, size-capped and rotated (`<logFile>.1` … `.N`). */
  logFile: string;
  /** TCP ports on `probeHost` that must accept connections for the workload to be ready. None: ready once started. */
  readinessPorts?: number[];
  restartPolicy?: RestartPolicy;
  /** Grace period between SIGTERM and SIGKILL on stop. Default 10 s. */
  terminationGracePeriodMs?: number;
}

export type RestartPolicy =
  | { kind: 'Never' }
  /** Restart after any exit (Always) or non-zero exit (OnFailure), with exponential backoff initial→max. */
  | { kind: 'Always' | 'OnFailure'; initialBackoffMs?: number; maxBackoffMs?: number };

export type WorkloadPhase = 'pending' | 'running' | 'succeeded' | 'failed';

export interface WorkloadStatus {
  name: string;
  labels: Record<string, string>;
  phase: WorkloadPhase;
  ready: boolean;
  pid?: number;
  exitCode?: number;
  /** Signal that ended the last run, if any. */
  signal?: string;
  restarts: number;
  /** RFC 3339 time of the current (or last) start. */
  startedAt?: string;
  message: string;
}

export type WorkloadEvent = { type: 'ADDED' | 'MODIFIED' | 'DELETED'; status: WorkloadStatus };

/** Starts, watches and stops data-plane workloads (local processes here; pods in a Kubernetes runtime). */
export interface WorkloadRuntime {
  /** Starts a workload; rejects if one with the same name exists. Resolves once the process is spawned (or failed to). */
  start(spec: WorkloadSpec): Promise<WorkloadStatus>;
  /** Stops (SIGTERM, then SIGKILL after the grace period), removes the workload and resolves with its last status. */
  stop(name: string, opts?: { gracePeriodMs?: number }): Promise<WorkloadStatus>;
  get(name: string): WorkloadStatus | undefined;
  list(labels?: Record<string, string>): WorkloadStatus[];
  /** Status changes as they happen; ends when `signal` aborts. Starts with ADDED for existing workloads. */
  watch(signal: AbortSignal): AsyncIterable<WorkloadEvent>;
  /** Stops every workload (shutdown). */
  stopAll(opts?: { gracePeriodMs?: number }): Promise<void>;
}

export class WorkloadExistsError extends Error {
  constructor(name: string) {
    super(`workload ${name} already exists`);
    this.name = 'WorkloadExistsError';
  }
}
export class WorkloadNotFoundError extends Error {
  constructor(name: string) {
    super(`workload ${name} not found`);
    this.name = 'WorkloadNotFoundError';
  }
}

/** Whether a workload's labels carry every label of the selector (no selector: all match). */
export function matchesLabels(labels: Readonly<Record<string, string>>, selector?: Readonly<Record<string, string>>): boolean {
  return Object.entries(selector ?? {}).every(([k, v]) => labels[k] === v);
}
