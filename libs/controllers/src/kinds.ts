import type {
  BackingImage as BackingImageCrd,
  BackingImageDataSource as BackingImageDataSourceCrd,
  BackingImageManager as BackingImageManagerCrd,
  BackupBackingImage as BackupBackingImageCrd,
  BackupTarget as BackupTargetCrd,
  Node as NodeCrd,
  Setting as SettingCrd,
} from '@bis/crd-types';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { defineKind, type ObjectMeta, type ResourceKind, type Stored } from '@bis/datastore';

/** A `@bis/crd-types` object with the datastore's metadata type (name required). */
export type WithMeta<T> = Omit<T, 'metadata'> & { metadata: ObjectMeta };

export type BackingImage = WithMeta<BackingImageCrd>;
export type BackingImageDataSource = WithMeta<BackingImageDataSourceCrd>;
export type BackingImageManager = WithMeta<BackingImageManagerCrd>;
export type BackupBackingImage = WithMeta<BackupBackingImageCrd>;
export type BackupTarget = WithMeta<BackupTargetCrd>;
export type Node = WithMeta<NodeCrd>;
export type Setting = WithMeta<SettingCrd>;

/**
 * A replica that uses a backing image on a disk. Longhorn's Replica CR carries far more; the backing-image
 * controllers only need these three fields (the labels `longhorn.io/backing-image` and `longhorndiskuuid` are set
 * by {@link replicaLabels} so lookups by label work as in Longhorn).
 */
export interface Replica {
  apiVersion: typeof LONGHORN_API_VERSION;
  kind: 'Replica';
  metadata: ObjectMeta;
  spec: { backingImage: string; nodeID: string; diskID: string };
  status?: Record<string, never>;
}

const kind = <T extends { apiVersion: string; kind: string; metadata: ObjectMeta }>(k: string, plural: string): ResourceKind<T> =>
  defineKind<T>({ apiVersion: LONGHORN_API_VERSION, kind: k, plural, namespaced: true });

export const BackingImageKind = kind<BackingImage>('BackingImage', 'backingimages');
export const BackingImageDataSourceKind = kind<BackingImageDataSource>('BackingImageDataSource', 'backingimagedatasources');
export const BackingImageManagerKind = kind<BackingImageManager>('BackingImageManager', 'backingimagemanagers');
export const BackupBackingImageKind = kind<BackupBackingImage>('BackupBackingImage', 'backupbackingimages');
export const BackupTargetKind = kind<BackupTarget>('BackupTarget', 'backuptargets');
export const NodeKind = kind<Node>('Node', 'nodes');
export const ReplicaKind = kind<Replica>('Replica', 'replicas');
/** Settings have no status subresource semantics that matter here; `value` is top-level. */
export const SettingKind = defineKind<Setting>({
  apiVersion: LONGHORN_API_VERSION,
  kind: 'Setting',
  plural: 'settings',
  namespaced: true,
  statusSubresource: true,
});

export type StoredBI = Stored<BackingImage>;
export type StoredBIDS = Stored<BackingImageDataSource>;
export type StoredBIM = Stored<BackingImageManager>;
export type StoredBBI = Stored<BackupBackingImage>;
export type StoredNode = Stored<Node>;
export type StoredReplica = Stored<Replica>;
