// Starting and stopping real `plaza serve` processes, for the browser tests (test/global-setup.mjs)
// and the browser measurements (bench/).
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/**
 * Starts `binary serve --listen 127.0.0.1:0` with `extraArgs`; resolves with `{addr, child}` once
 * it listens (`addr`: host:port, read from its first line).
 */
export function startPlaza(binary, extraArgs) {
  const child = spawn(binary, ['serve', '--listen', '127.0.0.1:0', ...extraArgs], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
  });
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout });
    child.once('exit', (code) => reject(new Error(`plaza ${extraArgs.join(' ')} exited early with ${code}`)));
    child.once('error', reject);
    lines.once('line', (line) => {
      const match = /open http:\/\/([^/\s]+)\//.exec(line);
      if (match?.[1]) resolve({ addr: match[1], child });
      else {
        child.kill('SIGKILL');
        reject(new Error(`unexpected first line from plaza: ${line}`));
      }
    });
  });
}

/** Stops `child` (SIGTERM, SIGKILL after 10 s) and resolves once it has exited. */
export async function stopPlaza(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}
