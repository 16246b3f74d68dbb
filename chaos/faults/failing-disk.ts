// The failing-disk fault (chaos drill 9): an LD_PRELOAD shim (failing-disk.c) that, while a
// trigger file exists, fails writes with ENOSPC or fsync/fdatasync with EIO — only for files under
// one data directory, so the process's logging and sockets keep working. Production code is not
// touched: the child process is started with the environment failingDiskEnv returns.
//
//   const so = await buildFailingDisk(dir);           // null: no C compiler here (reason logged)
//   spawn(node, args, { env: { ...process.env, ...failingDiskEnv(so, trigger, 'enospc', dataDir) } });
//   writeFileSync(trigger, '');                        // the disk is full from now on
//   rmSync(trigger);                                   // and has room again
import { execFile } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** The shim's C source. */
export const failingDiskSource = resolve(import.meta.dirname, 'failing-disk.c');

export type FailingDiskMode = 'enospc' | 'eio-fsync';

/**
 * Compiles the shim into `outDir` (created if missing) and returns the shared object's path, or
 * null, with the reason on stderr, when it cannot be built here (no `cc`, not Linux).
 */
export async function buildFailingDisk(outDir: string): Promise<string | null> {
  if (process.platform !== 'linux') {
    console.warn(`failing-disk: not built: LD_PRELOAD and /proc/self/fd are Linux-only (platform ${process.platform})`);
    return null;
  }
  mkdirSync(outDir, { recursive: true });
  const so = join(outDir, 'failing-disk.so');
  try {
    await run('cc', ['-shared', '-fPIC', '-O2', '-o', so, failingDiskSource, '-ldl'], { timeout: 60_000 });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: string };
    const reason =
      e.code === 'ENOENT' ? 'no C compiler (`cc` not found on PATH)' : `cc failed: ${(e.stderr ?? e.message).trim()}`;
    console.warn(`failing-disk: not built: ${reason}`);
    return null;
  }
  return so;
}

/**
 * The environment a child needs for the fault: the shim preloaded (after any LD_PRELOAD already in
 * this process's environment), the data directory it may fail, the trigger file and the mode.
 * Paths are made absolute: the shim compares them with /proc/self/fd links.
 */
export function failingDiskEnv(
  soPath: string,
  triggerFile: string,
  mode: FailingDiskMode,
  dataDir: string,
): Record<string, string> {
  const preload = [process.env['LD_PRELOAD'], resolve(soPath)]
    .filter((p): p is string => p !== undefined && p.length > 0)
    .join(':');
  return {
    LD_PRELOAD: preload,
    FAILING_DISK_DIR: resolve(dataDir),
    FAILING_DISK_TRIGGER: resolve(triggerFile),
    FAILING_DISK_MODE: mode,
  };
}
