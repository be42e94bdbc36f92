// The dashboard's `sso` case (tests/browser/dashboard.mjs runs it; see there for its options):
// single sign-on through a real OpenID Connect provider, in the browser, as a person does it.

const credentials = (text, what) => {
  const i = (text || '').indexOf(':');
  if (i < 1) throw new Error(`--${what} takes NAME:PASSWORD`);
  return { name: text.slice(0, i), password: text.slice(i + 1) };
};
const siteList = (text) => (text || '').split(',').map((x) => x.trim()).filter(Boolean);
const ssoSession = (page) => page.evaluate(() => JSON.parse(sessionStorage.getItem('landfall.sso') || 'null'));

/** Signs `who` in on the provider's page the dashboard sent the browser to, and back. */
async function providerSignIn(page, base, shot, issuer, who) {
  await page.waitForURL((u) => u.href.startsWith(`${issuer}/`));
  await page.waitForSelector('input[name="login"]');
  await shot(page, `sso-provider-${who.name}.png`);
  await page.fill('input[name="login"]', who.name);
  await page.fill('input[name="password"]', who.password);
  await page.click('button[type="submit"]');
  await page.waitForURL((u) => u.origin === base);
}

/** Confirms the end of the provider's session on its page; back on the dashboard, signing in asks for a password again. */
async function endProviderSession(page, base, issuer) {
  await page.waitForURL((u) => u.href.startsWith(`${issuer}/`));
  await page.click('button[name="logout"][value="yes"]');
  await page.waitForURL((u) => u.origin === base);
  await page.click('#sso-signin');
  await page.waitForURL((u) => u.href.startsWith(`${issuer}/`));
  await page.waitForSelector('input[name="login"]');
}

/** Waits until the sites table lists exactly `want`; says what it lists when it does not. */
async function listsExactly(page, want) {
  const rows = () => page.evaluate(() => [...document.querySelectorAll('#sites-table tbody tr[data-site]')].map((r) => r.dataset.site).sort());
  const sorted = JSON.stringify([...want].sort());
  const deadline = Date.now() + 30_000;
  while (JSON.stringify(await rows()) !== sorted) {
    if (Date.now() > deadline) throw new Error(`the table lists ${JSON.stringify(await rows())}, not ${sorted}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  await page.waitForSelector(`[data-tile="sites-total"][data-value="${want.length}"]`);
}

export async function ssoCase({ opt, base, newPage, step, shot, log, sel, watch }) {
  const user = credentials(opt.user, 'user');
  const [visible, hidden] = [siteList(opt.visible), siteList(opt.hidden)];
  if (!visible.length || !hidden.length || !opt.scope) throw new Error('--visible, --hidden and --scope are required for the sso case');
  const page = await newPage();
  watch(page);
  // Nothing leaves 127.0.0.1. The provider's own pages may ask (its sign-out page imports a web
  // font): refused, and said; the dashboard may not.
  const outside = [];
  await page.route('**/*', (route) => {
    const u = new URL(route.request().url());
    if (u.hostname === '127.0.0.1') return route.continue();
    const from = new URL(route.request().frame().url()).origin;
    if (from === base) outside.push(u.href);
    else log(`     refused ${u.href}, asked for by ${from}`);
    return route.abort();
  });
  const bearers = new Set();
  page.on('request', (r) => {
    const u = new URL(r.url());
    const auth = r.headers().authorization;
    if (u.origin === base && u.pathname.startsWith('/v1/') && auth) bearers.add(auth.replace(/^Bearer /, ''));
  });
  const issuer = await step('the sign-in screen offers the identity provider, and the token form', async () => {
    await page.goto(`${base}/`);
    const button = await page.waitForSelector('#sso-signin');
    const idp = await button.getAttribute('data-issuer');
    const text = (await button.textContent()).trim();
    if (text !== `Sign in with ${new URL(idp).host}`) throw new Error(`the button says ${JSON.stringify(text)}`);
    await page.waitForSelector('#login-form #token-input');
    return idp;
  });
  await shot(page, 'sso-sign-in.png');
  await step(`${user.name} signs in at ${issuer} and comes back signed in, live`, async () => {
    await page.click('#sso-signin');
    await providerSignIn(page, base, shot, issuer, user);
    await page.waitForSelector('#whoami[data-role="operator"]');
    await page.waitForSelector('#conn[data-conn="live"]');
  });
  const first = await step('the code is out of the address bar, the tokens in sessionStorage only, and sent to the API', async () => {
    if (new URL(page.url()).search) throw new Error(`the address bar still holds ${page.url()}`);
    const kept = await page.evaluate(() => ({
      keys: Object.keys(sessionStorage).filter((k) => k.startsWith('landfall.')),
      local: localStorage.length,
      cookies: document.cookie,
    }));
    if (JSON.stringify(kept) !== JSON.stringify({ keys: ['landfall.sso'], local: 0, cookies: '' })) throw new Error(`the page keeps ${JSON.stringify(kept)}`);
    const s = await ssoSession(page);
    if (!s.access_token || !s.refresh_token) throw new Error('no access or refresh token kept');
    if (!bearers.has(s.access_token)) throw new Error('the API calls did not carry the access token');
    return s;
  });
  await step(`the header says ${user.name}, operator, ${opt.scope}`, async () => {
    const said = await page.evaluate(() => ['.who-name', '.pill', '#who-scope'].map((s) => (document.querySelector(`#whoami ${s}`) || {}).textContent));
    const want = [user.name, 'operator', `· ${opt.scope}`];
    if (JSON.stringify(said) !== JSON.stringify(want)) throw new Error(`the header says ${JSON.stringify(said)}, not ${JSON.stringify(want)}`);
  });
  await step(`the fleet lists ${visible.join(', ')} and no other site`, () => listsExactly(page, visible));
  await shot(page, 'sso-fleet.png');
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  const rollout = await step(`a rollout ${user.name} starts names them, in the list and on its page`, async () => {
    // The dashboard has no button for it: the page's own session sends the command.
    const sent = await page.evaluate(async () => {
      const token = JSON.parse(sessionStorage.getItem('landfall.sso')).access_token;
      const call = (path, body) =>
        fetch(path, {
          method: body ? 'POST' : 'GET',
          headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
          body: body && JSON.stringify(body),
        }).then(async (r) => ({ status: r.status, body: await r.json() }));
      const kubelet = (await call('/v1/packages')).body.find((p) => p.name === 'kubelet');
      return call('/v1/commands/patch_package', { name: kubelet.name, version: kubelet.version });
    });
    if (sent.status !== 202 || sent.body.actor !== `user:${user.name}`) throw new Error(`patch_package answered ${sent.status}: ${JSON.stringify(sent.body)}`);
    await page.click('a[data-nav="rollouts"]');
    const row = `#rollouts-table tr[data-rollout="${sent.body.id}"]`;
    await page.waitForSelector(`${row} [data-actor="user:${user.name}"]`);
    await page.click(`${row} th a`);
    const by = await page.waitForSelector('#rollout-actor');
    if ((await by.textContent()) !== `user:${user.name}`) throw new Error(`the rollout's page says it was started by ${await by.textContent()}`);
    return sent.body.id;
  });
  await shot(page, 'sso-rollout.png');
  await step(`${visible[0]}'s page offers Install, and it installs as ${user.name}`, async () => {
    await page.click('a.brand');
    await page.click(`${sel(visible[0])} a.site-link`);
    await page.waitForSelector(`#site-page[data-site="${visible[0]}"][data-state="registered"]`);
    await shot(page, 'sso-site.png');
    const answer = page.waitForResponse((r) => r.url().endsWith('/v1/commands/install_site'));
    await page.click('#install-btn');
    const res = await answer;
    const body = await res.json();
    if (res.status() !== 202 || body.actor !== `user:${user.name}`) throw new Error(`install_site answered ${res.status()}: ${JSON.stringify(body)}`);
    await page.waitForSelector(`#site-page[data-site="${visible[0]}"][data-state="installing"]`, { timeout: 60_000 });
  });
  await step(`${hidden[0]}'s page says it is not found`, async () => {
    const answer = page.waitForResponse((r) => new URL(r.url()).pathname === `/v1/sites/${hidden[0]}`);
    await page.evaluate((site) => {
      location.hash = `#/sites/${site}`;
    }, hidden[0]);
    const res = await answer;
    if (res.status() !== 404) throw new Error(`GET /v1/sites/${hidden[0]} answered ${res.status()}`);
    await page.waitForSelector(`#site-page[data-site="${hidden[0]}"] #site-not-found`);
    if (await page.locator('#install-btn').count()) throw new Error('the page offers Install');
  });
  await shot(page, 'sso-not-found.png');
  await step('the access token is renewed before it expires, and used, without a reload', async () => {
    const wait = Math.max(0, first.expires_at - Date.now()) + 20_000;
    await page.waitForFunction((old) => {
      const s = JSON.parse(sessionStorage.getItem('landfall.sso') || 'null');
      return s && s.access_token !== old;
    }, first.access_token, { timeout: wait });
    const next = await ssoSession(page);
    if (next.issued_at >= first.expires_at) throw new Error(`renewed ${next.issued_at - first.expires_at} ms after the token expired`);
    await page.click('a.brand');
    await listsExactly(page, visible);
    if (!bearers.has(next.access_token)) throw new Error('the renewed access token was not sent');
    if (!(await page.evaluate(() => window.__sameDocument === true))) throw new Error('the page was reloaded');
    log(`     renewed ${Math.round((first.expires_at - next.issued_at) / 1000)} s before the first token expired`);
  });
  await step('an access token the API refuses is renewed once, and the page carries on', async () => {
    await page.evaluate(() => {
      const s = JSON.parse(sessionStorage.getItem('landfall.sso'));
      sessionStorage.setItem('landfall.sso', JSON.stringify({ ...s, access_token: 'refused' }));
    });
    await page.reload();
    await page.waitForSelector('#whoami[data-role="operator"]');
    await listsExactly(page, visible);
    if ((await ssoSession(page)).access_token === 'refused') throw new Error('the token was not renewed');
  });
  await step('signing out returns to the sign-in screen, the tokens gone, and offers to end the provider session', async () => {
    await page.click('#signout');
    await page.waitForSelector('#login-form #token-input');
    await page.waitForSelector('#sso-signin');
    await page.waitForSelector('#sso-signed-out:not([hidden]) #sso-end-session');
    const left = await page.evaluate(() => Object.keys(sessionStorage).filter((k) => k.startsWith('landfall.')));
    if (left.length) throw new Error(`sessionStorage still holds ${left.join(', ')}`);
    if (await page.locator('#whoami:not([hidden])').count()) throw new Error('the header still names someone');
  });
  await shot(page, 'sso-signed-out.png');
  await step("ending the provider's session: signing in asks for a password again", async () => {
    await page.click('#sso-end-session');
    await page.waitForURL((u) => u.href.startsWith(`${issuer}/`));
    await endProviderSession(page, base, issuer);
  });
  if (opt.viewer) {
    const viewer = credentials(opt.viewer, 'viewer');
    await step(`${viewer.name} signs in, a viewer of ${hidden.join(', ')} only, offered no Install`, async () => {
      await providerSignIn(page, base, shot, issuer, viewer);
      await page.waitForSelector('#whoami[data-role="viewer"]');
      await listsExactly(page, hidden);
      await page.click(`${sel(hidden[0])} a.site-link`);
      await page.waitForSelector(`#site-page[data-site="${hidden[0]}"][data-state="registered"]`);
      if (await page.locator('#install-btn').count()) throw new Error('a viewer was offered Install');
      await page.click('a[data-nav="rollouts"]');
      await page.waitForFunction(() => document.querySelector('#rollouts-table') || /No rollouts yet/.test(document.querySelector('#view').textContent));
      if (await page.locator(`[data-rollout="${rollout}"]`).count()) throw new Error(`${viewer.name} is shown ${user.name}'s rollout`);
    });
    await shot(page, 'sso-viewer.png');
  }
  if (opt.nobody) {
    const nobody = credentials(opt.nobody, 'nobody');
    await step(`${nobody.name}, granted nothing, is told so and may end the provider session to sign in as someone else`, async () => {
      if (opt.viewer) {
        await page.click('#signout');
        await page.click('#sso-end-session');
        await endProviderSession(page, base, issuer);
      }
      await providerSignIn(page, base, shot, issuer, nobody);
      const said = await (await page.waitForSelector('#login-error:not([hidden])')).textContent();
      if (!said.includes('granted nothing')) throw new Error(`the sign-in screen says ${JSON.stringify(said)}`);
      await page.waitForSelector('#sso-signed-out:not([hidden]) #sso-end-session');
      const left = await page.evaluate(() => Object.keys(sessionStorage).filter((k) => k.startsWith('landfall.')));
      if (left.length) throw new Error(`sessionStorage still holds ${left.join(', ')}`);
    });
    await shot(page, 'sso-nobody.png');
  }
  if (outside.length) throw new Error(`the dashboard asked for more than 127.0.0.1: ${[...new Set(outside)].join(', ')}`);
}

