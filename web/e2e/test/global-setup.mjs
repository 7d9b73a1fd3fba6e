// Starts real `plaza serve` processes on free ports for the whole test run, and stops them
// after (as clients/ts/test/global-setup.ts does): one for the status page test, one for the
// demo app tests and one for the development-mode demo test, so that none sees another's
// connections and rooms (the status page test counts them exactly). All serve the demo app
// (web/demo/dist, built by `npm test`'s pretest script) with --web-dir when it is built; the
// demo tests fail with a clear message when it is not.
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { startPlaza as start, stopPlaza } from '../plaza-process.mjs';

const binary = fileURLToPath(new URL('../../../target/debug/plaza', import.meta.url));
const demoDist = fileURLToPath(new URL('../../demo/dist', import.meta.url));

const servers = [];

/** Starts `plaza serve` with these extra arguments; resolves with its host:port. */
async function startPlaza(extraArgs) {
  const { addr, child } = await start(binary, extraArgs);
  servers.push(child);
  return addr;
}

export async function setup(project) {
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: run \`cargo build -p plaza\` at the repository root first`);
  }
  const built = existsSync(`${demoDist}/index.html`);
  const webDir = built ? ['--web-dir', demoDist] : [];
  let statusAddr;
  let demoAddr;
  let devAddr;
  try {
    // The demo's server verifies identities: the page gets its tokens from the demo token route,
    // as an app gets them from its backend (the status page's server stays in development mode).
    const tokens = ['--jwt-secret', randomBytes(24).toString('hex'), '--demo-tokens'];
    [statusAddr, demoAddr, devAddr] = await Promise.all([
      startPlaza(['--auto-create-rooms', ...webDir]),
      startPlaza([...tokens, ...webDir]),
      // As `scripts/run.sh` runs it: development mode, no token keys.
      startPlaza([...webDir]),
    ]);
  } catch (err) {
    await teardown();
    throw err;
  }
  // host:port of each server, e.g. 127.0.0.1:40123.
  project.provide('plazaAddr', statusAddr);
  project.provide('demoAddr', demoAddr);
  project.provide('devAddr', devAddr);
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
  await Promise.all(servers.splice(0).map(stopPlaza));
}
