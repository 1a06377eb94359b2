import { defineKind, type KubeObject, type ResourceKind } from '@bis/datastore';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  BackupTargetKind,
  EventKind,
  NodeKind,
  ReplicaKind,
  SecretKind,
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

/** Core `v1` Node (cluster scope) as the API double stores it (tests play the node lifecycle controller). */
export interface TestKubeNode extends KubeObject {
  spec?: Record<string, unknown>;
  status?: { conditions?: { type: string; status: string; reason?: string; message?: string }[] };
}
export const TestKubeNodeKind = defineKind<TestKubeNode>({ apiVersion: 'v1', kind: 'Node', plural: 'nodes', namespaced: false });

/** `apps/v1` DaemonSet as the API double stores it (the daemon looks for Longhorn's manager DaemonSet at start). */
export interface TestDaemonSet extends KubeObject {
  spec?: Record<string, unknown>;
}
export const TestDaemonSetKind = defineKind<TestDaemonSet>({ apiVersion: 'apps/v1', kind: 'DaemonSet', plural: 'daemonsets', namespaced: true });

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
  SecretKind,
  TestPodKind,
  TestKubeNodeKind,
  TestDaemonSetKind,
  EventKind,
] as ResourceKind[];
