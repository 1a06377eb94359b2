/** A receive failed: the sender's data, the file, the sender's behaviour, a timeout or a cancellation. */
export class SsyncReceiveError extends Error {
  override readonly name = 'SsyncReceiveError';
}
