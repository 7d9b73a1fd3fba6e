// Starts real `plaza serve` processes on free ports for the whole test run, and stops them
// after (as clients/ts/test/global-setup.ts does): one for the status page test and one for
// the demo app test, so that neither sees the other's connections and rooms. Both serve the
// demo app (web/demo/dist, built by `npm test`'s pretest script) with --web-dir when it is
// built; the demo test fails with a clear message when it is not.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const binary = fileURLToPath(new URL('../../../target/debug/plaza', import.meta.url));
const demoDist = fileURLToPath(new URL('../../demo/dist', import.meta.url));

const servers = [];

/** Starts `plaza serve` with these extra arguments; resolves with its host:port. */
async function startPlaza(extraArgs) {
  const child = spawn(binary, ['serve', '--listen', '127.0.0.1:0', ...extraArgs], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
  });
  servers.push(child);
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout });
    child.once('exit', (code) => reject(new Error(`plaza ${extraArgs.join(' ')} exited early with ${code}`)));
    child.once('error', reject);
    lines.once('line', (line) => {
      const match = /open http:\/\/([^/\s]+)\//.exec(line);
      if (match?.[1]) resolve(match[1]);
      else reject(new Error(`unexpected first line from plaza: ${line}`));
    });
  });
}

export async function setup(project) {
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: run \`cargo build -p plaza\` at the repository root first`);
  }
  const built = existsSync(`${demoDist}/index.html`);
  const webDir = built ? ['--web-dir', demoDist] : [];
  let statusAddr;
  let demoAddr;
  try {
    [statusAddr, demoAddr] = await Promise.all([startPlaza(['--auto-create-rooms', ...webDir]), startPlaza(webDir)]);
  } catch (err) {
    await teardown();
    throw err;
  }
  // host:port of each server, e.g. 127.0.0.1:40123.
  project.provide('plazaAddr', statusAddr);
  project.provide('demoAddr', demoAddr);
  // Why the demo test cannot run, if it cannot (it fails with this message).
  project.provide(
    'demoMissing',
    built
      ? ''
      : `${demoDist}/index.html is missing: build the demo first ` +
          '(`npm --prefix ../demo ci && npm --prefix ../demo run build`; `npm test` runs that as its pretest script)',
  );
}

export async function teardown() {
  await Promise.all(
    servers.splice(0).map(async (child) => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }),
  );
}
