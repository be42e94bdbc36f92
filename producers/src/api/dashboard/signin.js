// Single sign-on for the dashboard: OpenID Connect's authorization code flow with PKCE (S256),
// run in the page itself against the identity provider that GET /v1/auth names.
//
// The person is sent to the provider with a fresh PKCE verifier, state and nonce, kept in this
// tab's sessionStorage until they come back to the dashboard's own origin + '/'. There the state
// is checked, the code is taken out of the address bar and exchanged at the token endpoint, and
// the ID token's issuer, audience and nonce are checked. The tokens stay in sessionStorage only.
// The access token is the bearer token of every API call and of the events stream (app.js reads
// it from here); it is renewed with the refresh token shortly before it expires, and once more
// when the API refuses it. Signing out forgets the tokens and can end the provider's session.
//
// Exposes `window.landfallSignIn`; app.js drives it.
'use strict';

window.landfallSignIn = (() => {
  const SESSION_KEY = 'landfall.sso';
  const PENDING_KEY = 'landfall.sso.pending';
  // Renew this long before the access token expires, or at a quarter of its life if sooner.
  const RENEW_BEFORE_MS = 60_000;
  // After a renewal that could not reach the provider, try again this soon.
  const RETRY_MS = 5_000;
  // What the provider adds to the redirect URI (RFC 6749 4.1.2, RFC 9207, OIDC session management).
  const RESPONSE_PARAMS = ['code', 'state', 'iss', 'session_state', 'error', 'error_description', 'error_uri'];

  /** The provider as /v1/auth describes it (`oidc`), or null when the API takes tokens only. */
  let config = null;
  let renewing = null;
  let timer = null;
  let handlers = null;

  /** A refusal to show the person; `transient` when trying again later may work. */
  class SignInError extends Error {
    constructor(message, { code, transient } = {}) {
      super(message);
      this.code = code || '';
      this.transient = Boolean(transient);
    }
  }

  function base64url(bytes) {
    let s = '';
    for (const b of new Uint8Array(bytes)) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  const random = (n) => base64url(crypto.getRandomValues(new Uint8Array(n)));

  async function s256(verifier) {
    if (!window.isSecureContext || !crypto.subtle) {
      throw new SignInError(
        'Signing in with the identity provider needs the dashboard on https (or on localhost): WebCrypto is not available on this page. An API token still works.',
      );
    }
    return base64url(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier)));
  }

  function read(key) {
    try {
      return JSON.parse(sessionStorage.getItem(key) || 'null');
    } catch {
      return null;
    }
  }

  function write(key, value) {
    if (value === null || value === undefined) sessionStorage.removeItem(key);
    else sessionStorage.setItem(key, JSON.stringify(value));
  }

  /** A JWT's claims (read, not verified: the token came straight from the token endpoint). */
  function claims(jwt) {
    const part = String(jwt || '').split('.')[1];
    if (!part) throw new SignInError('The identity provider sent an ID token that is not a JWT.');
    const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
    const bin = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
    return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
  }

  const redirectUri = () => `${location.origin}/`;

  /** The provider's host, as the sign-in button names it. */
  function host() {
    try {
      return new URL(config.issuer).host;
    } catch {
      return config ? config.issuer : '';
    }
  }

  /**
   * Reads GET /v1/auth (no token needed): the provider's settings, or null when the API has no
   * identity provider (or predates single sign-on). Throws when the API does not answer.
   */
  async function discover() {
    const res = await fetch('/v1/auth', { headers: { Accept: 'application/json' }, cache: 'no-store' });
    if (res.status === 404) {
      config = null;
      return null;
    }
    if (!res.ok) throw new Error(`GET /v1/auth answered ${res.status}`);
    const body = await res.json();
    const o = body && body.oidc;
    config = o && o.issuer && o.authorization_endpoint && o.token_endpoint && o.dashboard_client ? o : null;
    return config;
  }

  /** This tab's tokens from the provider, when they are for the provider the API names now. */
  function session() {
    const s = read(SESSION_KEY);
    if (s && config && s.issuer === config.issuer && s.access_token) return s;
    if (s) write(SESSION_KEY, null);
    return null;
  }

  /** Sends the person to the provider's sign-in page; they come back to `finish`. */
  async function begin() {
    if (!config) throw new SignInError('The API names no identity provider.');
    const verifier = random(48);
    const pending = { state: random(24), nonce: random(24), verifier, issuer: config.issuer, hash: location.hash };
    const url = new URL(config.authorization_endpoint);
    const q = url.searchParams;
    q.set('response_type', 'code');
    q.set('client_id', config.dashboard_client);
    q.set('redirect_uri', redirectUri());
    q.set('scope', config.scopes || 'openid');
    q.set('state', pending.state);
    q.set('nonce', pending.nonce);
    q.set('code_challenge', await s256(verifier));
    q.set('code_challenge_method', 'S256');
    // OpenID Connect grants offline_access (the refresh token) only when consent is asked for.
    if (/(^|\s)offline_access(\s|$)/.test(q.get('scope'))) q.set('prompt', 'consent');
    write(PENDING_KEY, pending);
    location.assign(url.href);
  }

  /** Whether the page was opened by the provider's answer to `begin`. */
  function returning() {
    const q = new URLSearchParams(location.search);
    return q.has('state') && (q.has('code') || q.has('error'));
  }

  /** Takes the provider's answer out of the address bar, back to the page the person was on. */
  function cleanAddress(hash) {
    const q = new URLSearchParams(location.search);
    for (const p of RESPONSE_PARAMS) q.delete(p);
    const rest = q.toString();
    history.replaceState(null, '', `${location.pathname}${rest ? `?${rest}` : ''}${hash || location.hash || ''}`);
  }

  async function tokenRequest(fields) {
    let res;
    try {
      res = await fetch(config.token_endpoint, {
        method: 'POST',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
        body: new URLSearchParams({ client_id: config.dashboard_client, ...fields }),
        credentials: 'omit',
        cache: 'no-store',
      });
    } catch (e) {
      throw new SignInError(`The identity provider does not answer (${e.message}).`, { transient: true });
    }
    const body = await res.json().catch(() => ({}));
    if (!res.ok || !body.access_token) {
      const why = body.error_description || body.error || `${res.status} ${res.statusText}`;
      throw new SignInError(`The identity provider refused: ${why}.`, { code: body.error, transient: res.status >= 500 });
    }
    return body;
  }

  function keep(t, before) {
    const now = Date.now();
    const s = {
      issuer: config.issuer,
      access_token: t.access_token,
      // A provider that does not rotate refresh tokens sends none with a refreshed access token.
      refresh_token: t.refresh_token || (before && before.refresh_token) || null,
      id_token: t.id_token || (before && before.id_token) || null,
      issued_at: now,
      expires_at: now + Math.max(Number(t.expires_in) || 300, 10) * 1000,
    };
    write(SESSION_KEY, s);
    return s;
  }

  /**
   * Completes a sign-in on the page the provider sent the person back to: checks the state,
   * exchanges the code (with the PKCE verifier), checks the ID token, keeps the tokens.
   */
  async function finish() {
    const q = new URLSearchParams(location.search);
    const pending = read(PENDING_KEY);
    write(PENDING_KEY, null);
    // The code is good for one exchange: whatever happens, it leaves the address bar now.
    cleanAddress(pending && pending.hash);
    if (!pending || q.get('state') !== pending.state) {
      throw new SignInError('The answer from the identity provider does not belong to a sign-in started in this tab: sign in again.');
    }
    if (q.has('error')) {
      throw new SignInError(`The identity provider did not sign you in: ${q.get('error_description') || q.get('error')}.`, { code: q.get('error') });
    }
    if (!config || config.issuer !== pending.issuer) throw new SignInError('The API names another identity provider now: sign in again.');
    // RFC 9207: a provider that says who it is must be the one the sign-in went to.
    if (q.has('iss') && q.get('iss') !== config.issuer) throw new SignInError(`The answer came from ${q.get('iss')}, not ${config.issuer}.`);
    const t = await tokenRequest({
      grant_type: 'authorization_code',
      code: q.get('code') || '',
      redirect_uri: redirectUri(),
      code_verifier: pending.verifier,
    });
    if (t.id_token) {
      const c = claims(t.id_token);
      const aud = Array.isArray(c.aud) ? c.aud : [c.aud];
      if (c.iss !== config.issuer) throw new SignInError(`The ID token is from ${c.iss}, not ${config.issuer}.`);
      if (!aud.includes(config.dashboard_client)) throw new SignInError('The ID token is not for the dashboard.');
      if (c.nonce !== pending.nonce) throw new SignInError('The ID token does not carry the nonce of this sign-in.');
    }
    return keep(t, null);
  }

  /** Renews the access token with the refresh token (one renewal at a time); null without one. */
  function renew() {
    if (!renewing) {
      renewing = (async () => {
        const s = session();
        if (!s || !s.refresh_token) return null;
        const t = await tokenRequest({ grant_type: 'refresh_token', refresh_token: s.refresh_token });
        const next = keep(t, s);
        schedule();
        if (handlers) handlers.renewed(next);
        return next;
      })().finally(() => {
        renewing = null;
      });
    }
    return renewing;
  }

  /** Arms the renewal shortly before the access token expires. */
  function schedule(delay) {
    clearTimeout(timer);
    timer = null;
    const s = session();
    if (!s || !s.refresh_token || !handlers) return;
    const early = Math.min(RENEW_BEFORE_MS, (s.expires_at - s.issued_at) / 4);
    const wait = delay !== undefined ? delay : Math.max(0, s.expires_at - early - Date.now());
    timer = setTimeout(async () => {
      try {
        await renew();
      } catch (e) {
        if (e.transient) schedule(RETRY_MS);
        else if (handlers) handlers.ended(e);
      }
    }, wait);
  }

  /** Keeps the session renewed: `renewed(session)` after each renewal, `ended(error)` when refused. */
  function watch(on) {
    handlers = on;
    schedule();
  }

  /**
   * Forgets this tab's tokens. Returns where to end the provider's session too (its
   * end_session_endpoint, back to the dashboard afterwards), or null when it has none.
   */
  function forget() {
    clearTimeout(timer);
    timer = null;
    handlers = null;
    const s = read(SESSION_KEY);
    write(SESSION_KEY, null);
    write(PENDING_KEY, null);
    if (!s || !config || !config.end_session_endpoint || s.issuer !== config.issuer) return null;
    const url = new URL(config.end_session_endpoint);
    url.searchParams.set('client_id', config.dashboard_client);
    url.searchParams.set('post_logout_redirect_uri', redirectUri());
    if (s.id_token) url.searchParams.set('id_token_hint', s.id_token);
    return url.href;
  }

  /**
   * Shows the provider's part of the sign-in screen under `root` (the login template's #sso):
   * the button, and after a sign-out the offer to end the provider's session at `endSession`.
   * `fail(message)` shows what went wrong.
   */
  function mount(root, { endSession, fail }) {
    const box = root.querySelector('#sso');
    if (!box || !config) return;
    box.hidden = false;
    for (const el of box.querySelectorAll('.sso-host')) el.textContent = host();
    const button = box.querySelector('#sso-signin');
    button.dataset.issuer = config.issuer;
    button.addEventListener('click', async () => {
      button.disabled = true;
      try {
        await begin();
      } catch (e) {
        button.disabled = false;
        fail(e.message);
      }
    });
    const offer = box.querySelector('#sso-signed-out');
    if (endSession && offer) {
      offer.hidden = false;
      offer.querySelector('#sso-end-session').addEventListener('click', () => location.assign(endSession));
    }
  }

  return {
    discover,
    session,
    begin,
    returning,
    finish,
    renew,
    watch,
    forget,
    mount,
    host,
    SignInError,
    get config() {
      return config;
    },
  };
})();
