import { nativeAddon } from './native.js';

/** A file range being sent to a socket by `sendFileToSocket`. */
export interface SendFileTransfer {
  /** Resolves with the bytes sent (all of them); rejects with the errno error (`code` EPIPE, ECONNRESET …, or ENODATA
   * when the file ended first). */
  readonly done: Promise<number>;
  /** Shuts the socket down so that `done` settles soon (rejecting); false when the transfer has already ended. */
  cancel(): boolean;
}

/** Whether `sendFileToSocket` can be used (the native addon is loaded and has it). */
export function sendFileAvailable(): boolean {
  const addon = nativeAddon();
  return typeof addon?.startSendFile === 'function' && typeof addon.cancelSendFile === 'function';
}

/**
 * Sends [offset, offset + length) of the file open as `fileFd` to the connected socket `socketFd` with sendfile(2):
 * the kernel passes the file's page-cache pages to the socket, without the read into user space and the copy back
 * that `read` + `write` cost. The transfer runs on a thread of its own, on duplicates of both descriptors (the caller
 * may close its own at any time; the connection then stays open until the transfer ends or is cancelled). Nothing else
 * may write to the socket until `done` settles. Throws when the addon lacks it (see `sendFileAvailable`).
 */
export function sendFileToSocket(socketFd: number, fileFd: number, offset: number, length: number): SendFileTransfer {
  const addon = nativeAddon();
  if (!addon?.startSendFile || !addon.cancelSendFile) {
    throw new Error('sendFileToSocket: the block_mapping addon is not built with sendfile support');
  }
  const cancelSendFile = addon.cancelSendFile.bind(addon);
  const { id, done } = addon.startSendFile(socketFd, fileFd, offset, length);
  return { done, cancel: () => cancelSendFile(id) };
}
