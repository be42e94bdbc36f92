// Drives the landfall dashboard in headless Chromium (Debian's /usr/bin/chromium) with
// playwright-core, as an operator would, against a running `landfall up`.
//
//   node tests/browser/dashboard.mjs --case install --url http://127.0.0.1:PORT \
//        --token OPERATOR --viewer-token VIEWER --out DIR
//   node tests/browser/dashboard.mjs --case scale --url ... --token ... --designs FILE --out DIR
//   node tests/browser/dashboard.mjs --case firstpaint --url ... --token ... --sites N [--runs R]
//   node tests/browser/dashboard.mjs --case cutoff --url ... --token ... --site SITE --out DIR
//   node tests/browser/dashboard.mjs --case reimage --url ... --token ... --site SITE --out DIR
//   node tests/browser/dashboard.mjs --case sso --url ... --token ... --user NAME:PASSWORD \
//        --scope TEXT --visible SITE,... --hidden SITE,... [--viewer NAME:PASSWORD] \
//        [--nobody NAME:PASSWORD] --out DIR
//
// `install`: edge-01 shows as registered; the Install button on its page installs it, and the
//   page follows it to installed with every node ready, without a reload. A viewer sees no
//   Install button. A newer kubelet then rolls out, and its rollout page follows it to the end.
// `scale`: with the dashboard open, the sites in FILE (register_site bodies) are registered
//   through the API; the overview counts them live while the table fetches only pages and
//   dirty rows. Then a fresh page's first render is timed, and search and paging are used.
// `firstpaint`: a fresh page over a fleet of N sites, loaded R times (the first with nothing
//   cached): first-contentful-paint and largest-contentful-paint by the Performance API, and
//   when the sites table got its first row and the overview its total, by the page's clock;
//   then, on the first load, how busy the page was over the next seconds (its long tasks) and
//   how many events its feed replayed. Prints one line `firstpaint: {JSON}` (`landfall bench
//   api` reads it).
// `cutoff`: SITE, whose gateway the test has stopped mid-install, shows as cut off (a badge on
//   its row, the fleet's Cut off tile, a notice and the Link fact on its page) and still as
//   installing, not failed. Once the step saying so has passed, the test starts the gateway
//   again: the page shows the site up again, live, and its install going on to installed.
// `reimage`: SITE, installed, gets a new os-image (registered and rolled out through the API)
//   while its page is open; each node's Metal3 column, as the page draws it, passes
//   deprovisioning → provisioning → provisioned, live, and ends at the new image.
//
// `sso`: the API names an identity provider; the sign-in screen offers it and keeps the token
//   form. USER (an operator) signs in at the provider's own page and comes back signed in, the
//   code gone from the address bar, the tokens in sessionStorage only, the header naming them,
//   their role and SCOPE. The fleet lists exactly the --visible sites. A rollout USER starts
//   names them as its author; the first visible site offers Install, which installs it as USER;
//   the first --hidden site is not found. The access token is renewed before it expires, and
//   once more when the API refuses it. Signing out returns to the sign-in screen and offers to
//   end the provider's session, which ends it. VIEWER, if given, then signs in and sees exactly
//   the --hidden sites, no Install button and not USER's rollout. NOBODY, whom the policy
//   grants nothing, is told so on the sign-in screen and offered to end the provider's session.
//   The browser may reach 127.0.0.1 only.
//
// playwright-core comes from LANDFALL_BROWSER_MODULES (scripts/ensure-browser prints it).
// Exits non-zero with the reason on the first check that fails, after a screenshot.

import { createRequire } from 'node:module';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

const CHROMIUM = '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];
const PAGE_SIZE = 50;

const { values: opt } = parseArgs({
  options: {
    case: { type: 'string' },
    url: { type: 'string' },
    token: { type: 'string' },
    'viewer-token': { type: 'string' },
    designs: { type: 'string' },
    site: { type: 'string' },
    sites: { type: 'string' },
    user: { type: 'string' },
    viewer: { type: 'string' },
    nobody: { type: 'string' },
    scope: { type: 'string' },
    visible: { type: 'string' },
    hidden: { type: 'string' },
    runs: { type: 'string', default: '5' },
    out: { type: 'string', default: '.' },
  },
});

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

for (const k of ['case', 'url', 'token']) if (!opt[k]) fail(`--${k} is required`);

const modules = process.env.LANDFALL_BROWSER_MODULES;
if (!modules) fail('LANDFALL_BROWSER_MODULES is not set: run `export LANDFALL_BROWSER_MODULES="$(scripts/ensure-browser)"` (scripts/test does it)');
let chromium;
try {
  ({ chromium } = createRequire(join(modules, 'resolve-from-here.js'))('playwright-core'));
} catch (e) {
  fail(`cannot load playwright-core from ${modules} (${e.message}): run scripts/ensure-browser`);
}

const base = opt.url.replace(/\/$/, '');
const started = Date.now();
const log = (msg) => console.log(`[${((Date.now() - started) / 1000).toFixed(1).padStart(6)}s] ${msg}`);

/** The API, as the test's operator (not through the browser). */
async function api(path, body) {
  const res = await fetch(`${base}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { Authorization: `Bearer ${opt.token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

const profile = mkdtempSync(join(tmpdir(), 'landfall-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  args: CHROMIUM_ARGS,
  viewport: { width: 1440, height: 900 },
  deviceScaleFactor: 1,
});
const pageErrors = [];

async function newPage() {
  const page = await context.newPage();
  page.setDefaultTimeout(30_000);
  page.on('pageerror', (e) => pageErrors.push(String(e && e.stack ? e.stack : e)));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource|net::ERR_ABORTED/.test(m.text())) log(`console error: ${m.text()}`);
  });
  return page;
}

let current = null;
async function shot(page, name) {
  const path = join(opt.out, name);
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot: ${path}`);
  return path;
}

/** Runs one check; on failure, a screenshot of the page shows where it stood. */
async function step(name, fn) {
  const t = Date.now();
  try {
    const out = await fn();
    log(`ok   ${name} (${Date.now() - t} ms)`);
    return out;
  } catch (e) {
    log(`FAIL ${name}: ${e.message.split('\n')[0]}`);
    if (current) await shot(current, `failed-${opt.case}.png`).catch(() => {});
    throw e;
  }
}

/**
 * A TCP proxy in front of the API for the browser, whose connections the test can cut: the
 * events stream breaks as it would when a network or a load balancer drops it.
 */
async function cuttableProxy(target) {
  const sockets = new Set();
  let down = false;
  const server = net.createServer((client) => {
    if (down) {
      client.destroy();
      return;
    }
    const upstream = net.connect(Number(target.port), target.hostname);
    const close = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', close);
      s.on('close', close);
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    /** Drops every connection, and refuses new ones for `ms`. */
    cut(ms) {
      down = true;
      for (const s of sockets) s.destroy();
      setTimeout(() => {
        down = false;
      }, ms);
    },
    close: () => server.close(),
  };
}

const sel = (site) => `#sites-table tbody tr[data-site="${site}"]`;

async function openDashboard(page, token = opt.token, origin = base) {
  await page.goto(`${origin}/#token=${token}`);
  await page.waitForSelector('#conn[data-conn="live"]');
}

async function installCase() {
  const page = await newPage();
  current = page;
  const via = await cuttableProxy(new URL(base));
  const resumes = [];
  page.on('request', (r) => {
    if (new URL(r.url()).pathname === '/v1/events' && r.headers()['last-event-id']) resumes.push(r.headers()['last-event-id']);
  });
  await step('the dashboard opens with the token from the fragment, and goes live', async () => {
    await openDashboard(page, opt.token, via.url);
    if (page.url().includes(opt.token)) throw new Error(`the token is still in the address bar: ${page.url()}`);
    const kept = await page.evaluate(() => sessionStorage.getItem('landfall.token'));
    if (kept !== opt.token) throw new Error('the token was not kept in sessionStorage');
    await page.waitForSelector('#whoami[data-role="operator"]');
    await page.evaluate(() => {
      window.__sameDocument = true;
    });
  });
  await step('edge-01 is in the sites table as registered', async () => {
    await page.waitForSelector(`${sel('edge-01')}[data-state="registered"]`);
    await page.waitForSelector('[data-tile="sites-total"][data-value="3"]');
  });
  await step("edge-01's page shows its 4 nodes, none installed", async () => {
    await page.click(`${sel('edge-01')} a.site-link`);
    await page.waitForSelector('#site-page[data-site="edge-01"][data-state="registered"]');
    await page.waitForFunction(() => {
      const rows = document.querySelectorAll('#nodes-table tbody tr[data-node]');
      return rows.length === 4 && [...rows].every((r) => r.dataset.step === 'not_installed');
    });
  });
  const clicked = await step('the Install button publishes install_site', async () => {
    const button = page.locator('#install-btn');
    const text = (await button.textContent()).trim();
    if (text !== 'Install') throw new Error(`the button says ${JSON.stringify(text)}`);
    const answer = page.waitForResponse((r) => r.url().endsWith('/v1/commands/install_site'));
    await button.click();
    const res = await answer;
    if (res.status() !== 202) throw new Error(`install_site answered ${res.status()}: ${await res.text()}`);
    return Date.now();
  });
  await step('the page turns to installing by itself', async () => {
    await page.waitForSelector('#site-page[data-state="installing"]', { timeout: 60_000 });
    log(`     installing ${Date.now() - clicked} ms after the click`);
  });
  await step('the events stream breaks mid-install: the page says so, then resumes', async () => {
    // While the nodes provision, so events arrive while the stream is down.
    await page.waitForSelector('#site-timeline li[data-type="NodeOsProvisioning"]', { timeout: 60_000 });
    via.cut(3000);
    await page.waitForSelector('#conn[data-conn="reconnecting"]', { timeout: 10_000 });
    await page.waitForSelector('#conn[data-conn="live"]', { timeout: 30_000 });
    if (!resumes.length) throw new Error('the reconnect sent no Last-Event-ID');
    log(`     resumed with Last-Event-ID ${resumes.join(', ')}`);
  });
  await step('then to installed, with every node ready', async () => {
    await page.waitForSelector('#site-page[data-state="installed"]', { timeout: 240_000 });
    await page.waitForFunction(
      () => {
        const rows = [...document.querySelectorAll('#nodes-table tbody tr[data-node]')];
        const ready = document.querySelector('[data-field="nodes-ready"]');
        return rows.length === 4 && rows.every((r) => r.dataset.step === 'ready' && r.dataset.metal3 === 'provisioned') && ready && ready.textContent === '4/4';
      },
      null,
      { timeout: 60_000 },
    );
    // The site's lease is let go just after the install ends: the page reads it once more.
    await page.waitForSelector('#site-page[data-busy=""]', { timeout: 30_000 });
    log(`     installed ${Date.now() - clicked} ms after the click`);
  });
  await step('the events arrived live: the timeline and the feed show SiteInstalled', async () => {
    await page.waitForSelector('#site-timeline li[data-type="SiteInstalled"]');
    await page.waitForSelector('#feed li[data-type="SiteInstalled"][data-site="edge-01"]');
    await page.waitForSelector('#site-timeline li[data-type="NodeOsProvisioning"]');
  });
  await step('no reload happened, and the feed holds every event once, none missed across the break', async () => {
    if (!(await page.evaluate(() => window.__sameDocument === true))) throw new Error('the page was reloaded');
    const seqs = await page.evaluate(() => [...document.querySelectorAll('#feed li[data-seq]')].map((li) => Number(li.dataset.seq)));
    const sorted = [...seqs].sort((a, b) => a - b);
    if (new Set(seqs).size !== seqs.length) throw new Error(`an event is in the feed twice: ${sorted.join(',')}`);
    const missing = sorted.length ? sorted[sorted.length - 1] - sorted[0] + 1 - sorted.length : 0;
    if (sorted[0] !== 1 || missing) throw new Error(`the feed misses ${missing} events: ${sorted.join(',')}`);
    log(`     events 1..${sorted[sorted.length - 1]} in the feed, each once`);
  });
  await shot(page, 'dashboard-site.png');

  await step('the fleet table followed too', async () => {
    await page.click('a.brand');
    await page.waitForSelector(`${sel('edge-01')}[data-state="installed"]`);
    await page.waitForSelector('[data-tile="state-installed"][data-value="1"]');
  });

  await step('the Joining page lists requests to join and identities (none in landfall up)', async () => {
    await page.click('a[data-nav="joining"]');
    await page.waitForSelector('#enrollments-table');
    await page.waitForSelector('#identities-table');
    if (await page.locator('.notice-error').count()) throw new Error(await page.locator('.notice-error').first().textContent());
    await page.click('a.brand');
  });

  if (opt['viewer-token']) {
    const viewer = await newPage();
    current = viewer;
    await step('without a token the dashboard asks for one, and refuses a wrong one', async () => {
      await viewer.goto(`${via.url}/`);
      await viewer.waitForSelector('#login-form');
      await viewer.fill('#token-input', 'not-a-token');
      await viewer.click('#login-form button[type="submit"]');
      await viewer.waitForSelector('#login-error:not([hidden])');
    });
    await step('a viewer signs in with the form, and sees the site but no Install button', async () => {
      await viewer.fill('#token-input', opt['viewer-token']);
      await viewer.click('#login-form button[type="submit"]');
      await viewer.waitForSelector('#whoami[data-role="viewer"]');
      await viewer.waitForSelector('#conn[data-conn="live"]');
      await viewer.goto(`${via.url}/#/sites/edge-02`);
      await viewer.waitForSelector('#site-page[data-site="edge-02"][data-state="registered"]');
      if (await viewer.locator('#install-btn').count()) throw new Error('a viewer was offered the Install button');
    });
    await viewer.close();
    current = page;
  }

  await step('a newer kubelet rolls out, and the fleet shows the rollout live', async () => {
    await api('/v1/commands/register_package', {
      package: { name: 'kubelet', version: '1.29.3', kind: 'binary', sha256: 'ab'.repeat(32), size: 111955968 },
    });
    await page.waitForSelector('#rollouts-card .rollout[data-phase]', { timeout: 60_000 });
  });
  await step('its page follows it to completed, every node patched', async () => {
    await page.click('#rollouts-card .rollout');
    await page.waitForSelector('#rollout-page[data-phase]');
    await page.waitForSelector('#rollout-page[data-phase="completed"]', { timeout: 180_000 });
    await page.waitForSelector('#rollout-sites tr[data-site="edge-01"]');
  });
  await shot(page, 'dashboard-rollout.png');
  await step('the fleet shows the new version', async () => {
    await page.click('a.brand');
    await page.waitForFunction(
      () => {
        const chip = document.querySelector('#sites-table tr[data-site="edge-01"] [data-pkg="kubelet"]');
        return chip && chip.textContent.includes('1.29.3') && !chip.textContent.includes('1.29.2');
      },
      null,
      { timeout: 30_000 },
    );
    if (!(await page.evaluate(() => window.__sameDocument === true))) throw new Error('the page was reloaded');
  });
  await shot(page, 'dashboard.png');
  via.close();
}

async function cutOffCase() {
  const site = opt.site;
  if (!site) fail('--site is required for the cutoff case');
  const page = await newPage();
  current = page;
  await step(`${site} is in the fleet as cut off, and still installing`, async () => {
    await openDashboard(page);
    await page.evaluate(() => {
      window.__sameDocument = true;
    });
    await page.waitForSelector(`${sel(site)}[data-state="installing"] .badge[data-link="cut_off"]`);
    await page.waitForSelector('[data-tile="sites-cut-off"][data-value="1"]');
    await page.waitForSelector('[data-tile="state-failed"][data-value="0"]');
  });
  await step('the site shows as cut off, since when, on its page, not failed', async () => {
    await page.click(`${sel(site)} a.site-link`);
    await page.waitForSelector(`#site-page[data-site="${site}"][data-state="installing"]`);
    const notice = await page.waitForSelector('#link-notice[data-link="cut_off"]');
    const since = await notice.getAttribute('data-since');
    const api_site = await api(`/v1/sites/${site}`);
    if (since !== api_site.link.since) throw new Error(`the notice says since ${since}, the API ${api_site.link.since}`);
    await page.waitForSelector('[data-field="link"][data-link="cut_off"]');
    if (await page.locator('#install-reason.notice-error').count()) throw new Error('the install shows as failed');
    const said = await page.locator(`#feed li[data-type="SiteCutOff"][data-site="${site}"]`).first().textContent();
    if (!said.includes('nothing heard since')) throw new Error(`the feed says of SiteCutOff: ${said}`);
  });
  await shot(page, 'dashboard-cut-off.png');
  await step('heard again, the page shows the site up, live', async () => {
    await page.waitForSelector('#link-notice', { state: 'detached', timeout: 60_000 });
    await page.waitForSelector('[data-field="link"][data-link="up"]');
    const restored = await page.waitForSelector(`#feed li[data-type="SiteLinkRestored"][data-site="${site}"]`);
    const said = await restored.textContent();
    if (!/heard again after \d+s cut off/.test(said)) throw new Error(`the feed says of SiteLinkRestored: ${said}`);
  });
  await step('and its install goes on to installed', async () => {
    await page.waitForSelector(`#site-page[data-site="${site}"][data-state="installed"]`, { timeout: 120_000 });
    await page.click('a.brand');
    await page.waitForSelector(`${sel(site)}[data-state="installed"]`);
    if (await page.locator(`${sel(site)} .badge[data-link="cut_off"]`).count()) throw new Error('the row still says cut off');
    await page.waitForSelector('[data-tile="sites-cut-off"][data-value="0"]');
    if (!(await page.evaluate(() => window.__sameDocument === true))) throw new Error('the page was reloaded');
  });
  await shot(page, 'dashboard-up-again.png');
}

async function reimageCase() {
  const site = opt.site;
  if (!site) fail('--site is required for the reimage case');
  const page = await newPage();
  current = page;
  const nodes = await step(`${site}'s page shows every node ready and provisioned`, async () => {
    await openDashboard(page);
    await page.goto(`${base}/#/sites/${site}`);
    await page.waitForSelector(`#site-page[data-site="${site}"][data-state="installed"]`);
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#nodes-table tbody tr[data-node]')];
      return rows.length > 0 && rows.every((r) => r.dataset.step === 'ready' && r.dataset.metal3 === 'provisioned');
    });
    return page.evaluate(() => [...document.querySelectorAll('#nodes-table tbody tr[data-node]')].map((r) => r.dataset.node));
  });
  await page.evaluate(() => {
    // Every Metal3 state each node's row shows, in order, as the page draws it.
    window.__metal3 = {};
    const look = () => {
      for (const row of document.querySelectorAll('#nodes-table tbody tr[data-node]')) {
        const seen = (window.__metal3[row.dataset.node] ||= []);
        const state = row.dataset.metal3;
        if (state && seen[seen.length - 1] !== state) seen.push(state);
      }
    };
    new MutationObserver(look).observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ['data-metal3'] });
    look();
  });
  await step('a new os-image is registered and rolled out through the API', async () => {
    await api('/v1/commands/register_package', {
      package: { name: 'ubuntu', version: '22.04.9', kind: 'os-image', sha256: '9'.repeat(64), size: 1048576 },
    });
    await api('/v1/commands/patch_package', { name: 'ubuntu', version: '22.04.9' });
  });
  await step('each node goes deprovisioning → provisioning → provisioned, live', async () => {
    const went = (seen) => {
      const d = seen.indexOf('deprovisioning');
      const p = seen.indexOf('provisioning', d);
      return d > 0 && p > d && seen.indexOf('provisioned', p) > p && seen[seen.length - 1] === 'provisioned';
    };
    const deadline = Date.now() + 120_000;
    let seen = {};
    while (!nodes.every((n) => went(seen[n] || []))) {
      if (Date.now() > deadline) throw new Error(`the rows showed ${JSON.stringify(seen)}`);
      await new Promise((r) => setTimeout(r, 250));
      seen = await page.evaluate(() => window.__metal3);
    }
    for (const n of nodes) log(`     ${n}: ${seen[n].join(' → ')}`);
  });
  await step('and runs the new image', async () => {
    await page.waitForFunction(
      (names) =>
        names.every((n) => {
          const chip = document.querySelector(`#nodes-table tr[data-node="${n}"] [data-pkg="ubuntu"]`);
          return chip && chip.textContent.includes('22.04.9');
        }),
      nodes,
      { timeout: 60_000 },
    );
  });
  await shot(page, 'dashboard-reimaged.png');
}

async function scaleCase() {
  if (!opt.designs) fail('--designs is required for the scale case');
  const bodies = JSON.parse(readFileSync(opt.designs, 'utf8'));
  const page = await newPage();
  current = page;
  const sitesRequests = [];
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.pathname === '/v1/sites') sitesRequests.push(u.searchParams);
  });
  await step('the dashboard opens on the demo sites', async () => {
    await openDashboard(page);
    await page.waitForSelector('[data-tile="sites-total"][data-value="3"]');
    await page.evaluate(() => {
      window.__sameDocument = true;
    });
  });
  const before = sitesRequests.length;
  const total = 3 + bodies.length;
  await step(`${bodies.length} sites are registered through the API while it is open`, async () => {
    let next = 0;
    const worker = async () => {
      while (next < bodies.length) {
        const body = bodies[next];
        next += 1;
        await api('/v1/commands/register_site', body);
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
  });
  await step(`the overview counts ${total} sites, live`, async () => {
    await page.waitForSelector(`[data-tile="sites-total"][data-value="${total}"]`, { timeout: 120_000 });
    await page.waitForSelector(`#page-info[data-total="${total}"]`, { timeout: 30_000 });
    if (!(await page.evaluate(() => window.__sameDocument === true))) throw new Error('the page was reloaded');
  });
  await step('the table fetched pages and dirty rows, never the whole fleet', async () => {
    const during = sitesRequests.slice(before);
    const widest = Math.max(0, ...during.map((q) => Number(q.get('limit') || 100)));
    const mostIds = Math.max(0, ...during.map((q) => (q.get('ids') ? q.get('ids').split(',').length : 0)));
    const rows = await page.locator('#sites-table tbody tr').count();
    log(`     ${during.length} /v1/sites requests for ${bodies.length} registrations; widest limit ${widest}, most ids ${mostIds}; ${rows} rows in the DOM`);
    if (rows > PAGE_SIZE) throw new Error(`${rows} rows in the DOM`);
    if (widest > PAGE_SIZE || mostIds > PAGE_SIZE) throw new Error(`a request asked for ${Math.max(widest, mostIds)} sites at once`);
    if (during.length > bodies.length / 4) throw new Error(`${during.length} requests for ${bodies.length} events`);
  });
  await page.close();

  const fresh = await newPage();
  current = fresh;
  const render = await step(`a fresh page renders the first page of ${total} sites`, async () => {
    const t0 = Date.now();
    await fresh.goto(`${base}/#token=${opt.token}`);
    await fresh.waitForFunction(
      (n) => {
        const tile = document.querySelector('[data-tile="sites-total"]');
        return tile && tile.dataset.value === String(n) && document.querySelectorAll('#sites-table tbody tr[data-site]').length > 0;
      },
      total,
    );
    const wall = Date.now() - t0;
    const inPage = await fresh.evaluate(() => Math.round(performance.now()));
    const rows = await fresh.locator('#sites-table tbody tr').count();
    const info = (await fresh.locator('#page-info').textContent()).trim();
    if (rows !== PAGE_SIZE) throw new Error(`${rows} rows rendered, not one page of ${PAGE_SIZE}`);
    if (info !== `1–${PAGE_SIZE} of ${total.toLocaleString('en-US')}`) throw new Error(`the pager says ${JSON.stringify(info)}`);
    return { wall, inPage, rows };
  });
  console.log(`first render: ${render.wall} ms from navigation to ${render.rows} rows of ${total} sites (${render.inPage} ms by the page's clock)`);
  await step('search finds one site', async () => {
    const t0 = Date.now();
    await fresh.fill('#site-search', 'edge-777');
    await fresh.waitForFunction(() => {
      const rows = document.querySelectorAll('#sites-table tbody tr[data-site]');
      return rows.length === 1 && rows[0].dataset.site === 'edge-777';
    });
    log(`     found in ${Date.now() - t0} ms`);
  });
  await step('paging moves through the fleet', async () => {
    await fresh.fill('#site-search', '');
    await fresh.waitForSelector(`#page-info[data-total="${total}"]`);
    await fresh.click('#page-next');
    await fresh.waitForFunction((n) => document.querySelector('#page-info').textContent.trim() === `51–100 of ${n}`, total.toLocaleString('en-US'));
    const rows = await fresh.locator('#sites-table tbody tr').count();
    if (rows !== PAGE_SIZE) throw new Error(`${rows} rows on the second page`);
    await fresh.click('#page-prev');
    await fresh.waitForFunction(() => document.querySelector('#page-info').textContent.trim().startsWith('1–50'));
  });
  await step('the state filter narrows the table', async () => {
    await fresh.selectOption('#state-filter', 'installed');
    await fresh.waitForFunction(() => document.querySelector('#page-info').dataset.total === '0');
    await fresh.selectOption('#state-filter', '');
    await fresh.waitForSelector(`#page-info[data-total="${total}"]`);
  });
  await shot(fresh, 'dashboard-1000.png');
}

/** Milliseconds by the page's clock, rounded to a tenth. */
const ms = (t) => (t === null || t === undefined ? null : Math.round(t * 10) / 10);
/** How long the first page is watched after its first row, for the long tasks that follow. */
const SETTLE_WATCH_MS = 5000;
const median = (xs) => {
  const s = xs.filter((x) => x !== null).sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)] : null;
};

async function firstPaintCase() {
  const sites = Number(opt.sites);
  const runs = Number(opt.runs);
  if (!(sites > 0) || !(runs > 0)) fail('--sites and --runs must be positive numbers for the firstpaint case');
  const loads = [];
  let settled = null;
  for (let i = 0; i < runs; i += 1) {
    const page = await newPage();
    current = page;
    // Before the page's own script: marks the moment the first row and the overview's total
    // enter the document, and keeps the largest paint.
    await page.addInitScript(() => {
      window.__lcp = null;
      window.__long = [];
      new PerformanceObserver((list) => {
        for (const e of list.getEntries()) window.__long.push(e.duration);
      }).observe({ type: 'longtask', buffered: true });
      new PerformanceObserver((list) => {
        for (const e of list.getEntries()) window.__lcp = e.startTime;
      }).observe({ type: 'largest-contentful-paint', buffered: true });
      new MutationObserver(() => {
        if (window.__firstRow === undefined && document.querySelector('#sites-table tbody tr[data-site]')) window.__firstRow = performance.now();
        if (window.__total === undefined && document.querySelector('[data-tile="sites-total"]')) window.__total = performance.now();
      }).observe(document, { childList: true, subtree: true });
    });
    const load = await step(`load ${i + 1} of ${runs}: the first page of ${sites} sites`, async () => {
      const t0 = Date.now();
      await page.goto(`${base}/#token=${opt.token}`);
      await page.waitForFunction(() => window.__firstRow !== undefined && window.__total !== undefined, null, { timeout: 60_000 });
      const wall = Date.now() - t0;
      // One more frame, so the row's paint is in the largest-contentful-paint entries.
      await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0))));
      const m = await page.evaluate(() => {
        const fcp = performance.getEntriesByType('paint').find((e) => e.name === 'first-contentful-paint');
        const nav = performance.getEntriesByType('navigation')[0];
        return {
          fcp: fcp ? fcp.startTime : null,
          lcp: window.__lcp,
          firstRow: window.__firstRow,
          total: window.__total,
          domContentLoaded: nav ? nav.domContentLoadedEventEnd : null,
          shown: document.querySelector('[data-tile="sites-total"]').dataset.value,
          rows: document.querySelectorAll('#sites-table tbody tr[data-site]').length,
          feed: (document.querySelector('#feed-count') || {}).textContent || '',
        };
      });
      if (Number(m.shown) !== sites) throw new Error(`the overview shows ${m.shown} sites, not ${sites}`);
      return { wall, ...m };
    });
    log(`     fcp ${ms(load.fcp)} ms, first row ${ms(load.firstRow)} ms, lcp ${ms(load.lcp)} ms, ${load.rows} rows, ${load.feed || 'no events yet'}`);
    loads.push(load);
    if (i === 0) {
      await shot(page, 'dashboard-firstpaint.png');
      await new Promise((resolve) => setTimeout(resolve, SETTLE_WATCH_MS));
      settled = await page.evaluate(() => ({
        long_tasks: window.__long.length,
        long_tasks_ms: Math.round(window.__long.reduce((a, d) => a + d, 0)),
        longest_task_ms: Math.round(Math.max(0, ...window.__long)),
        feed: document.querySelector('#feed-count').textContent,
      }));
      log(`     ${SETTLE_WATCH_MS} ms on: ${JSON.stringify(settled)}`);
    }
    await page.close();
  }
  const pick = (k) => loads.map((l) => ms(l[k]));
  const result = {
    runs,
    first_contentful_paint_ms: { cold: pick('fcp')[0], median: median(pick('fcp')), all: pick('fcp') },
    first_row_ms: { cold: pick('firstRow')[0], median: median(pick('firstRow')), all: pick('firstRow') },
    overview_total_ms: { cold: pick('total')[0], median: median(pick('total')) },
    largest_contentful_paint_ms: { cold: pick('lcp')[0], median: median(pick('lcp')) },
    dom_content_loaded_ms: { cold: pick('domContentLoaded')[0], median: median(pick('domContentLoaded')) },
    wall_to_first_row_ms: { cold: loads[0].wall, median: median(loads.map((l) => l.wall)) },
    rows: loads[0].rows,
    first_load_settling: { watched_ms_after_first_row: SETTLE_WATCH_MS, ...settled },
  };
  console.log(`firstpaint: ${JSON.stringify(result)}`);
}

let ok = false;
try {
  if (opt.case === 'install') await installCase();
  else if (opt.case === 'scale') await scaleCase();
  else if (opt.case === 'firstpaint') await firstPaintCase();
  else if (opt.case === 'cutoff') await cutOffCase();
  else if (opt.case === 'reimage') await reimageCase();
  // Loaded for its case only: `landfall bench api` runs this file alone, compiled in.
  else if (opt.case === 'sso') await (await import('./sso.mjs')).ssoCase({ opt, base, newPage, step, shot, log, sel, watch: (page) => (current = page) });
  else fail(`unknown case ${opt.case}`);
  if (pageErrors.length) throw new Error(`the page threw:\n${pageErrors.join('\n')}`);
  ok = true;
} catch (e) {
  console.error(`FAIL: ${e.message}`);
} finally {
  await context.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}
log(ok ? `${opt.case}: passed` : `${opt.case}: failed`);
process.exit(ok ? 0 : 1);
