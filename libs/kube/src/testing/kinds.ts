import { defineKind, type KubeObject, type ResourceKind } from '@bis/datastore';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  BackupTargetKind,
  NodeKind,
  ReplicaKind,
  SettingKind,
} from '@bis/controllers';

/** Core `v1` Pod as the API double stores it (tests play the kubelet by writing `status`). */
export interface TestPod extends KubeObject {
  spec: {
    nodeName?: string;
    containers: { name: string; image: string; command: string[] }[];
    volumes?: { name: string; hostPath?: { path: string } }[];
  };
  status?: { phase?: string; podIP?: string; containerStatuses?: { name: string; ready: boolean }[] };
}
export const TestPodKind = defineKind<TestPod>({ apiVersion: 'v1', kind: 'Pod', plural: 'pods', namespaced: true });

/** Every kind the controllers and the pod runtime use, for `KubeApiDouble.start({ kinds })`. */
export const CONTROLLER_KINDS: readonly ResourceKind[] = [
  BackingImageKind,
  BackingImageDataSourceKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  BackupTargetKind,
  NodeKind,
  ReplicaKind,
  SettingKind,
  TestPodKind,
] as ResourceKind[];
