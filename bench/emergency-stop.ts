// The last resort of a benchmark that starts processes: while armed, every process it started is
// killed synchronously if this process exits, and SIGINT/SIGTERM also remove its scratch folder and
// exit (130/143). The benchmark's own finally block stops everything properly and then disarms.
import { rmSync } from 'node:fs';

export interface EmergencyStop {
  /** Ctrl-C and SIGTERM are the benchmark's own business again (call first in the finally block). */
  signalsOff(): void;
  /** Nothing is killed on exit any more (call once everything is stopped). */
  exitOff(): void;
}

export function armEmergencyStop(killNow: () => void, scratch: string, progress: (msg: string) => void): EmergencyStop {
  const onSignal = (signal: NodeJS.Signals): void => {
    progress(`${signal}: stopping every process this benchmark started`);
    killNow();
    rmSync(scratch, { recursive: true, force: true });
    process.exit(signal === 'SIGINT' ? 130 : 143);
  };
  process.on('exit', killNow);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  return {
    signalsOff: () => {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    },
    exitOff: () => {
      process.off('exit', killNow);
    },
  };
}
