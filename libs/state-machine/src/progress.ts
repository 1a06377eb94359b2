import { FileEvent, FileState, FILE_MACHINE } from './file-state.js';
import { StateMachine, type TransitionRecord } from './machine.js';

/**
 * Progress rule shared by every file: `trunc(processed / size × 100)` when the size is known (> 0), else 0;
 * clamped to 0..100 (Longhorn's restore can briefly report more than 100 for a short last block: fixed here).
 */
export function computeProgress(processedSize: number, size: number): number {
  if (!(size > 0) || !(processedSize > 0)) return 0;
  const p = Math.trunc((processedSize / size) * 100);
  return p > 100 ? 100 : p;
}

export interface FileLifecycleSnapshot {
  state: FileState;
  size: number;
  processedSize: number;
  progress: number;
  message: string;
}

/**
 * A file's state plus its progress, with the rules of the data plane:
 * - the first progress update moves `starting` to `in-progress`;
 * - progress updates are ignored once the file is ready (or ready-for-transfer), failed or unknown;
 * - reaching `ready` sets progress to 100 and, when the size was unknown (≤ 0), the size to the processed size;
 * - failing keeps the first failure message (later errors are consequences, not causes).
 */
export class FileLifecycle {
  readonly #machine: StateMachine<FileState, FileEvent>;
  #size: number;
  #processed = 0;
  #progress = 0;
  #message = '';
  /** The message is a note of {@link note} (cleared by the next progress). */
  #noted = false;

  constructor(opts: { size?: number; initial?: FileState } = {}) {
    this.#machine = new StateMachine<FileState, FileEvent>(FILE_MACHINE, opts.initial ?? FileState.Pending);
    this.#size = opts.size ?? 0;
    if (this.#machine.state === FileState.Ready) this.#progress = 100;
  }

  get state(): FileState {
    return this.#machine.state;
  }
  get size(): number {
    return this.#size;
  }
  get processedSize(): number {
    return this.#processed;
  }
  get progress(): number {
    return this.#progress;
  }
  get message(): string {
    return this.#message;
  }

  snapshot(): FileLifecycleSnapshot {
    return {
      state: this.state,
      size: this.#size,
      processedSize: this.#processed,
      progress: this.#progress,
      message: this.#message,
    };
  }

  onTransition(listener: (t: TransitionRecord<FileState, FileEvent>) => void): () => void {
    return this.#machine.onTransition(listener);
  }

  /** Sets the expected size (e.g. once a Content-Length is known). */
  setSize(size: number): void {
    this.#size = size;
    this.#recompute();
  }

  /**
   * Records progress. `processed` is absolute. Returns false when the update was ignored
   * (the file is not being processed any more).
   */
  updateProgress(processed: number): boolean {
    const s = this.state;
    if (s === FileState.Starting) {
      this.#machine.fire(FileEvent.Progress);
    } else if (s !== FileState.InProgress) {
      return false;
    }
    if (this.#noted && processed > this.#processed) {
      this.#message = '';
      this.#noted = false;
    }
    this.#processed = processed;
    this.#recompute();
    return true;
  }

  /**
   * Says why a file still being processed waits (e.g. a retry of its source): its message until the next progress.
   * Ignored once the file is finished or failed. Returns whether it was taken.
   */
  note(message: string): boolean {
    const s = this.state;
    if (s !== FileState.Pending && s !== FileState.Starting && s !== FileState.InProgress) return false;
    this.#message = message;
    this.#noted = true;
    return true;
  }

  /** Adds `delta` bytes to the processed size (see {@link updateProgress}). */
  addProgress(delta: number): boolean {
    return this.updateProgress(this.#processed + delta);
  }

  /** Applies an event. `message` is stored for `fail`; cleared on transitions to a healthy state. */
  fire(event: FileEvent, message?: string): FileState {
    const wasFailed = this.state === FileState.Failed;
    this.#noted = false;
    const to = this.#machine.fire(event);
    if (to === FileState.Ready || to === FileState.ReadyForTransfer) {
      if (!(this.#size > 0)) this.#size = this.#processed;
      if (this.#processed < this.#size) this.#processed = this.#size;
      this.#progress = 100;
      this.#message = message ?? '';
    } else if (to === FileState.Failed) {
      if (!wasFailed && message !== undefined) this.#message = message;
    } else if (message !== undefined) {
      this.#message = message;
    }
    return to;
  }

  /** Applies the event only if it is legal; returns whether it was applied. */
  tryFire(event: FileEvent, message?: string): boolean {
    if (!this.#machine.can(event)) return false;
    this.fire(event, message);
    return true;
  }

  can(event: FileEvent): boolean {
    return this.#machine.can(event);
  }

  #recompute(): void {
    if (this.state === FileState.Ready || this.state === FileState.ReadyForTransfer) return;
    this.#progress = computeProgress(this.#processed, this.#size);
  }
}
