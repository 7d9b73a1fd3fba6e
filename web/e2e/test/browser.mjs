// Debian's chromium through playwright-core (which never downloads a browser of its own),
// headless and quiet: the one browser setup every test here uses.
import { chromium } from 'playwright-core';

/** The browser binary; `E2E_CHROMIUM` overrides Debian's. */
export const CHROMIUM = process.env.E2E_CHROMIUM ?? '/usr/bin/chromium';

const ARGS = [
  '--no-sandbox',
  '--headless',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** Launches chromium; close it when done. */
export function launchChromium() {
  return chromium.launch({ executablePath: CHROMIUM, args: ARGS });
}
