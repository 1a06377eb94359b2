/** A byte range of a file. */
export interface Extent {
  offset: number;
  length: number;
}

/** Where a file has data and where it has holes (both sorted, together covering [0, size)). */
export interface FileLayout {
  size: number;
  data: Extent[];
  holes: Extent[];
}

export type FileLayoutProvider = (filePath: string) => Promise<FileLayout>;
export type HolePuncher = (filePath: string, offset: number, length: number) => Promise<void>;
