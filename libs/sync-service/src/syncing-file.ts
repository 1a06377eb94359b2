import { FILE_MACHINE, FileLifecycle, FileState, transition } from '@bis/state-machine';
import type { ExpectedChecksum } from '@bis/file-sources/core';

/** Longhorn's `api.FileInfo` (JSON key order as Go emits it). */
export interface FileInfo {
  diskUUID: string;
  expectedChecksum: string;
  filePath: string;
  uuid: string;
  size: number;
  virtualSize: number;
  realSize: number;
  state: FileState;
  progress: number;
  processedSize: number;
  modificationTime: string;
  currentChecksum: string;
  message: string;
  sendingReference: number;
  /** Our extension, only on a file zero-padded to a multiple of 512: its size and SHA-512 before the padding. */
  unpaddedSize?: number;
  unpaddedChecksum?: string;
}

export type DataEngine = 'v1' | 'v2';

/** One file owned by the sync service: its identity, its lifecycle (state + progress) and its running work. */
export class SyncingFile {
  readonly lifecycle: FileLifecycle;
  virtualSize = 0;
  realSize = 0;
  modificationTime = '';
  currentChecksum = '';
  sendingReference = 0;
  /**
   * What the work on the file says while it goes on without failing (e.g. a download attempt that failed and is tried
   * again): the `message` of a file that is not finished and has no message of its own.
   */
  notice = '';
  /** The file as made before it was zero-padded (a restore of an unaligned backup), when it was. */
  unpadded: { size: number; sha512: string } | undefined;
  readonly controller = new AbortController();
  /** The background work (prepare + action + finish); settles when nothing runs on the file any more. */
  task: Promise<void> = Promise.resolve();

  constructor(
    readonly filePath: string,
    readonly uuid: string,
    readonly diskUUID: string,
    /** The expected checksum as given (normalised text; '' = none). */
    readonly expectedChecksum: string,
    readonly expected: ExpectedChecksum | undefined,
    size: number,
    readonly dataEngine: DataEngine = 'v1',
  ) {
    this.lifecycle = new FileLifecycle({ size });
  }

  get state(): FileState {
    return this.lifecycle.state;
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  info(): FileInfo {
    const l = this.lifecycle.snapshot();
    const going = l.state === FileState.Pending || l.state === FileState.Starting || l.state === FileState.InProgress;
    // Built field by field in Go's order (Longhorn clients and tests compare the JSON key order).
    return {
      diskUUID: this.diskUUID,
      expectedChecksum: this.expectedChecksum,
      filePath: this.filePath,
      uuid: this.uuid,
      size: l.size,
      virtualSize: this.virtualSize,
      realSize: this.realSize,
      // the file's lifecycle owns the state: the info mirrors it
      state: transition(FILE_MACHINE, l.state, { reported: l.state }, this.filePath),
      progress: l.progress,
      processedSize: l.processedSize,
      modificationTime: this.modificationTime,
      currentChecksum: this.currentChecksum,
      message: l.message || (going ? this.notice : ''),
      sendingReference: this.sendingReference,
      ...(this.unpadded ? { unpaddedSize: this.unpadded.size, unpaddedChecksum: this.unpadded.sha512 } : {}),
    };
  }
}
