import { formatBytes, formatDuration } from '@bis/api-client';

/**
 * A one-line progress bar with throughput and ETA, redrawn in place on a terminal. On anything else it writes
 * nothing (scripts read the final result, not the bar).
 */
export class ProgressBar {
  private readonly started = Date.now();
  private samples: { t: number; done: number }[] = [];
  private lastDraw = 0;
  private drawn = false;

  constructor(
    private readonly out: NodeJS.WriteStream,
    private readonly label: string,
    private readonly enabled = !!out.isTTY,
  ) {}

  /** Byte progress (`done` of `total`, total ≤ 0 when unknown). */
  bytes(done: number, total: number, force = false): void {
    if (!this.enabled) return;
    const now = Date.now();
    this.samples.push({ t: now, done });
    while (this.samples.length > 2 && now - this.samples[0].t > 5000) this.samples.shift();
    if (!force && now - this.lastDraw < 100) return;
    this.lastDraw = now;
    const first = this.samples[0];
    const rate = now > first.t ? ((done - first.done) * 1000) / (now - first.t) : 0;
    const pct = total > 0 ? Math.min(100, (done * 100) / total) : 0;
    const eta = rate > 0 && total > 0 ? (total - done) / rate : NaN;
    this.draw(pct, `${formatBytes(done)}${total > 0 ? `/${formatBytes(total)}` : ''}  ${formatBytes(rate)}/s  ETA ${formatDuration(eta)}`);
  }

  /** Percent progress with a state text (a copy being prepared on a disk). */
  percent(pct: number, text: string): void {
    if (!this.enabled) return;
    const elapsed = (Date.now() - this.started) / 1000;
    this.draw(pct, `${text}  ${formatDuration(elapsed)}`);
  }

  private draw(pct: number, text: string): void {
    const width = 24;
    const fill = Math.round((pct / 100) * width);
    const line = `${this.label} [${'#'.repeat(fill)}${'-'.repeat(width - fill)}] ${pct.toFixed(0).padStart(3)}%  ${text}`;
    const cols = this.out.columns || 120;
    this.out.write(`\r${line.slice(0, cols - 1)}\x1b[K`);
    this.drawn = true;
  }

  /** Ends the bar line (so later output starts on a fresh line). */
  done(): void {
    if (this.drawn) this.out.write('\n');
    this.drawn = false;
  }
}
