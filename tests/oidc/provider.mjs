// A real OpenID Connect provider for landfall's single sign-on tests: oidc-provider (the certified
// Node.js implementation) with landfall's two clients, users from a file, and signing keys from a
// file, listening on 127.0.0.1 only.
//
//   node tests/oidc/provider.mjs --port N --users USERS.json --keys KEYS.json \
//     [--access-token-ttl SECONDS] [--audience URN] [--dashboard-redirect-uri URI]...
//   node tests/oidc/provider.mjs --new-key     prints a new RS256 private JWK (with a kid), to
//                                              put in a KEYS.json file
//
// --port 0 picks a free port. Once the provider listens it prints one line,
// `issuer http://127.0.0.1:<port>`, to stdout; the issuer is always that URL.
//
// oidc-provider is loaded from $LANDFALL_OIDC_MODULES, the node_modules directory that
// scripts/ensure-oidc-provider installs and prints (scripts/test sets it).
//
// USERS.json: [{"sub": "alice", "password": "…", "name": "Alice", "email": "alice@example.test",
//   "groups": ["eu-ops"], "preferred_username": "alice"}]; preferred_username defaults to sub.
//   A person signs in with the sub as the login name and the password from the file.
// KEYS.json: {"keys": [private JWKs]}; the first key of an algorithm signs, every key is
//   published in the JWKS. Rotating keys is restarting on the same port with another file.
//
// Clients:
//   landfall-dashboard  public web client: authorization code with PKCE (S256), refresh tokens,
//                       the --dashboard-redirect-uri values (default http://127.0.0.1:8080/);
//                       the token endpoint answers CORS requests from their origins, since the
//                       dashboard's script exchanges the code itself.
//   landfall-cli        public native client: device authorization grant, and authorization
//                       code with PKCE on the loopback redirect http://127.0.0.1/callback (any
//                       port, RFC 8252); refresh tokens.
// Access tokens are RS256 JWTs for the audience (default urn:landfall:api), the default resource
// so clients need not send `resource`, carrying sub, preferred_username, email and groups.
// First-party clients: consent is granted without asking, so signing in is name and password.

import { randomBytes, randomUUID, generateKeyPairSync, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

function fail(message) {
  console.error(`provider.mjs: ${message}`);
  process.exit(2);
}

const { values: opt } = parseArgs({
  options: {
    port: { type: 'string' },
    users: { type: 'string' },
    keys: { type: 'string' },
    'access-token-ttl': { type: 'string', default: '600' },
    audience: { type: 'string', default: 'urn:landfall:api' },
    'dashboard-redirect-uri': { type: 'string', multiple: true, default: ['http://127.0.0.1:8080/'] },
    'new-key': { type: 'boolean', default: false },
  },
});

if (opt['new-key']) {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  console.log(JSON.stringify({ ...jwk, kid: randomUUID(), alg: 'RS256', use: 'sig' }));
  process.exit(0);
}

for (const k of ['port', 'users', 'keys']) if (opt[k] === undefined) fail(`--${k} is required`);
const port = Number(opt.port);
const accessTokenTtl = Number(opt['access-token-ttl']);
if (!Number.isInteger(port) || port < 0 || port > 65535) fail(`--port ${opt.port} is not a port`);
if (!Number.isInteger(accessTokenTtl) || accessTokenTtl < 1) fail('--access-token-ttl takes whole seconds');

const modules = process.env.LANDFALL_OIDC_MODULES;
if (!modules) fail('LANDFALL_OIDC_MODULES is not set: run `export LANDFALL_OIDC_MODULES="$(scripts/ensure-oidc-provider)"` (scripts/test does it)');
let Provider;
try {
  const entry = createRequire(join(modules, 'resolve-from-here.js')).resolve('oidc-provider');
  ({ default: Provider } = await import(pathToFileURL(entry).href));
} catch (e) {
  fail(`cannot load oidc-provider from ${modules} (${e.message}): run scripts/ensure-oidc-provider`);
}

const users = JSON.parse(readFileSync(opt.users, 'utf8'));
const jwks = JSON.parse(readFileSync(opt.keys, 'utf8'));
if (!Array.isArray(users)) fail(`${opt.users} must hold a JSON array of users`);
if (!Array.isArray(jwks.keys) || jwks.keys.length === 0) fail(`${opt.keys} must hold {"keys": [private JWKs]}`);
const userBySub = new Map(users.map((u) => [u.sub, u]));
const username = (u) => u.preferred_username ?? u.sub;

const audience = opt.audience;
const scopes = 'openid profile email groups offline_access';
// What an access token for the API is allowed to carry as `scope`.
const apiScopes = 'profile email groups';
const dashboardRedirects = opt['dashboard-redirect-uri'];
const firstParty = new Set(['landfall-dashboard', 'landfall-cli']);

function passwordMatches(user, password) {
  const want = Buffer.from(String(user?.password ?? ''));
  const got = Buffer.from(String(password ?? ''));
  return user !== undefined && want.length === got.length && timingSafeEqual(want, got);
}

const configuration = {
  clients: [
    {
      client_id: 'landfall-dashboard',
      client_name: 'landfall dashboard',
      application_type: 'web',
      token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      redirect_uris: dashboardRedirects,
      post_logout_redirect_uris: dashboardRedirects,
    },
    {
      client_id: 'landfall-cli',
      client_name: 'landfall CLI',
      application_type: 'native',
      token_endpoint_auth_method: 'none',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'authorization_code', 'refresh_token'],
      response_types: ['code'],
      redirect_uris: ['http://127.0.0.1/callback'],
    },
  ],
  jwks,
  cookies: { keys: [randomBytes(32).toString('base64url')] },
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  scopes: scopes.split(' '),
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    deviceFlow: { enabled: true },
    revocation: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => audience,
      // The access token is for the API even though `openid` was asked for too.
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => {
        if (resource !== audience) throw new Provider.errors.InvalidTarget(`unknown resource ${resource}`);
        return {
          audience,
          scope: apiScopes,
          accessTokenFormat: 'jwt',
          accessTokenTTL: accessTokenTtl,
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  ttl: {
    AccessToken: accessTokenTtl,
    DeviceCode: 600,
    IdToken: 3600,
    RefreshToken: 14 * 24 * 3600,
    Interaction: 600,
    Session: 24 * 3600,
    Grant: 14 * 24 * 3600,
  },
  clientBasedCORS(_ctx, origin, client) {
    return client.clientId === 'landfall-dashboard'
      && client.redirectUris.some((uri) => URL.parse(uri)?.origin === origin);
  },
  async findAccount(_ctx, sub) {
    const user = userBySub.get(sub);
    if (!user) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub,
          name: user.name,
          preferred_username: username(user),
          email: user.email,
          email_verified: user.email !== undefined,
          groups: user.groups ?? [],
        };
      },
    };
  },
  async extraTokenClaims(_ctx, token) {
    const user = token.accountId === undefined ? undefined : userBySub.get(token.accountId);
    if (!user) return undefined;
    return { preferred_username: username(user), email: user.email, groups: user.groups ?? [] };
  },
  // Consent for the first-party clients: everything they ask for, granted at sign-in.
  async loadExistingGrant(ctx) {
    const { client, session, provider } = ctx.oidc;
    const grantId = ctx.oidc.result?.consent?.grantId || session.grantIdFor(client.clientId);
    if (grantId) {
      const grant = await provider.Grant.find(grantId);
      if (grant) return grant;
    }
    if (!firstParty.has(client.clientId) || !session.accountId) return undefined;
    const grant = new provider.Grant({ clientId: client.clientId, accountId: session.accountId });
    grant.addOIDCScope(scopes);
    grant.addResourceScope(audience, apiScopes);
    await grant.save();
    return grant;
  },
};

const server = createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(port, '127.0.0.1', resolve);
});
const issuer = `http://127.0.0.1:${server.address().port}`;
const provider = new Provider(issuer, configuration);

function page(title, body) {
  return `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${title}</title></head>`
    + `<body><h1>${title}</h1>${body}</body></html>`;
}

function escape(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginForm(uid, message) {
  return page('Sign in', `${message ? `<p class="error">${escape(message)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
  <input type="text" name="login" autofocus required>
  <input type="password" name="password" required>
  <button type="submit">Sign in</button>
</form>`);
}

async function formBody(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 64 * 1024) throw new Error('form too large');
    chunks.push(chunk);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

// The sign-in pages: a name and a password checked against the users file. Consent is never
// asked of a person (see loadExistingGrant); if the provider asks anyway, it is granted here.
provider.use(async (ctx, next) => {
  const m = /^\/interaction\/([^/]+)(\/login)?$/.exec(ctx.path);
  if (!m) return next();
  ctx.set('cache-control', 'no-store');
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.uid !== m[1]) ctx.throw(400, 'interaction mismatch');
  const { prompt, params, session } = details;

  if (prompt.name === 'consent') {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
    if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
    for (const [indicator, s] of Object.entries(prompt.details.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, s.join(' '));
    }
    const to = await provider.interactionResult(ctx.req, ctx.res, { consent: { grantId: await grant.save() } }, {
      mergeWithLastSubmission: true,
    });
    ctx.status = 303;
    ctx.redirect(to);
    return undefined;
  }
  if (prompt.name !== 'login') ctx.throw(501, `no page for the ${prompt.name} prompt`);

  if (ctx.method === 'GET' && !m[2]) {
    ctx.type = 'html';
    ctx.body = loginForm(details.uid);
    return undefined;
  }
  if (ctx.method !== 'POST' || !m[2]) ctx.throw(405);
  const form = await formBody(ctx.req);
  const user = userBySub.get(form.get('login'));
  if (!passwordMatches(user, form.get('password'))) {
    ctx.status = 401;
    ctx.type = 'html';
    ctx.body = loginForm(details.uid, 'wrong name or password');
    return undefined;
  }
  const to = await provider.interactionResult(ctx.req, ctx.res, { login: { accountId: user.sub } }, {
    mergeWithLastSubmission: false,
  });
  ctx.status = 303;
  ctx.redirect(to);
  return undefined;
});

server.on('request', provider.callback());
console.log(`issuer ${issuer}`);

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
