// A real `plaza serve` child process on a free port: for the whole run (global-setup.ts), and
// for tests that need a server configured otherwise (tokens, say).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const binary = fileURLToPath(new URL('../../../target/debug/plaza', import.meta.url));

/** A running server: its `host:port`, and how to stop it. */
export interface PlazaProcess {
  addr: string;
  stop: () => Promise<void>;
}

/** Starts `plaza serve --listen 127.0.0.1:0 ...args`; resolves once it prints its address. */
export async function startPlaza(args: string[], env: Record<string, string> = {}): Promise<PlazaProcess> {
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: run \`cargo build -p plaza\` at the repository root first`);
  }
  const child = spawn(binary, ['serve', '--listen', '127.0.0.1:0', ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, RUST_LOG: process.env['RUST_LOG'] ?? 'warn', ...env },
  });
  const addr = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    child.once('exit', (code) => reject(new Error(`plaza exited early with ${code}`)));
    child.once('error', reject);
    lines.once('line', (line) => {
      const match = /open http:\/\/([^/\s]+)\//.exec(line);
      if (match?.[1]) resolve(match[1]);
      else reject(new Error(`unexpected first line from plaza: ${line}`));
    });
  });
  const stop = async (): Promise<void> => {
    if (child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  };
  return { addr, stop };
}
