// Every drill, in the order `npm run chaos` runs them (the order).
import type { Drill } from '../drill-runner.js';
import { agentRestart } from './agent-restart.js';
import { cellCutoff } from './cell-cutoff.js';
import { coordinatorPartition } from './coordinator-partition.js';
import { coordinatorsDown } from './coordinators-down.js';
import { failingDisk } from './failing-disk.js';
import { leaderKill } from './leader-kill.js';
import { leaderPause } from './leader-pause.js';
import { rollingRestart } from './rolling-restart.js';
import { slowCoordinator } from './slow-coordinator.js';

export const DRILLS: readonly Drill[] = [
  leaderKill,
  leaderPause,
  coordinatorPartition,
  cellCutoff,
  coordinatorsDown,
  slowCoordinator,
  agentRestart,
  rollingRestart,
  failingDisk,
];
