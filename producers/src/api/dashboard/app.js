// The landfall dashboard: one page over the HTTP API, live over Server-Sent Events.
//
// Reads go to /v1/*, the operator's commands to /v1/commands/*, both with the bearer token: an
// API token, or the access token from the identity provider (signin.js signs a person in).
// Events come from /v1/events, read with fetch() (EventSource cannot send a header) and
// parsed here. An event marks its site dirty; only the dirty sites of the page on screen are
// fetched again (in one batched request), and the overview and rollouts at most once a
// second, so a fleet of thousands of sites costs one page of rows per refresh.
'use strict';

(() => {
  const PAGE_SIZE = 50;
  const SITE_STATES = ['registered', 'installing', 'installed', 'degraded', 'failed'];
  const ROLLOUT_PHASES = ['running', 'paused', 'halted', 'completed', 'cancelled'];
  const FEED_MAX = 200;
  const TIMELINE_MAX = 150;
  const SITE_HISTORY_MS = 24 * 60 * 60 * 1000;
  // Refresh pacing: dirty rows at most this often, the overview and rollouts at most this often,
  // and once more this long after the last event (the read model may trail the event a little).
  const ROWS_EVERY_MS = 600;
  const SUMMARY_EVERY_MS = 1000;
  const SETTLE_MS = 2000;
  const SAFETY_REFRESH_MS = 30000;
  const STALL_MS = 45000;
  const TOKEN_KEY = 'landfall.token';

  // ---------------------------------------------------------------- small helpers

  /** Creates an element: h('a', {href, class, dataset: {...}}, child, 'text', ...). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'style') Object.assign(el.style, v);
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'text') el.textContent = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    append(el, children);
    return el;
  }

  /** Replaces an element's children (nested arrays flattened, null and false skipped). */
  function fill(el, ...children) {
    el.replaceChildren();
    return append(el, children);
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const num = (n) => Number(n || 0).toLocaleString('en-US');
  const $ = (sel, root = document) => root.querySelector(sel);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const label = (s) => String(s || '').replace(/_/g, ' ');
  const shortId = (id) => String(id || '').slice(0, 8);
  const plural = (n, word) => `${num(n)} ${word}${Number(n) === 1 ? '' : 's'}`;
  // The steps a node's report carries when it was out of service only a moment.
  const heldSteps = (steps) => {
    if (!steps) return '';
    const done = [
      steps.cordoned && 'cordoned',
      steps.drained && `drained (${plural((steps.evicted || []).length, 'pod')} evicted)`,
      steps.uncordoned && 'uncordoned',
    ].filter(Boolean);
    return done.length ? ` (${done.join(', ')})` : '';
  };
  // A node's report, alone or in its site's report.
  const nodePatched = (e) =>
    (e.unchanged ? `${e.node}: at ${pkg(e.package)} already, left as it was` : `${e.node}: ${e.from_version} → ${pkg(e.package)}`) + heldSteps(e.steps);

  function relTime(iso) {
    if (!iso) return '';
    const t = Date.parse(iso);
    if (Number.isNaN(t)) return '';
    const s = Math.max(0, Math.round((Date.now() - t) / 1000));
    if (s < 5) return 'just now';
    if (s < 60) return `${s}s ago`;
    if (s < 3600) return `${Math.floor(s / 60)}m ago`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
    return `${Math.floor(s / 86400)}d ago`;
  }

  function clock(iso) {
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? '' : d.toLocaleTimeString('en-GB', { hour12: false });
  }

  // A time the bus carries as milliseconds since the epoch (a number, or a string for int64).
  function unixMs(ms) {
    const n = Number(ms);
    return n > 0 ? new Date(n).toISOString() : '';
  }

  function fullTime(iso) {
    const d = new Date(iso);
    return iso && !Number.isNaN(d.getTime()) ? d.toLocaleString('en-GB', { hour12: false }) : '';
  }

  function duration(fromIso, toIso) {
    const a = Date.parse(fromIso);
    const b = toIso ? Date.parse(toIso) : Date.now();
    if (Number.isNaN(a) || Number.isNaN(b)) return '';
    const s = Math.max(0, Math.round((b - a) / 1000));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  }

  /** A <time> whose text says how long ago; refreshed by the clock tick. */
  function ago(iso) {
    if (!iso) return h('span', { class: 'muted' }, '—');
    return h('time', { datetime: iso, title: fullTime(iso), dataset: { rel: iso } }, relTime(iso));
  }

  function bytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Number(n || 0);
    let i = 0;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return `${v >= 10 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
  }

  // Whether the hub counts the site cut off (nothing heard of its gateway for a while).
  function cutOff(s) {
    return Boolean(s.link && s.link.state === 'cut_off');
  }

  // What a cut-off site said of itself last, in words.
  function linkText(link) {
    const parts = [`Nothing heard of the site's gateway since ${fullTime(link.since)}.`];
    if (link.last_report) parts.push(`Its last report: ${link.last_report.type} at ${fullTime(link.last_report.time)}.`);
    if (link.outbox_waiting) parts.push(`${link.outbox_waiting} report(s) were waiting at the site.`);
    parts.push('Its work goes on; what it reports arrives when it is heard again.');
    return parts.join(' ');
  }

  function badge(kind, value, extra) {
    return h('span', { class: `badge ${kind}-${value}`, dataset: { [kind]: value } }, label(value), extra);
  }

  function toast(message, kind = 'info') {
    const el = h('div', { class: `toast toast-${kind}` }, message);
    $('#toasts').append(el);
    setTimeout(() => el.classList.add('toast-out'), kind === 'error' ? 9000 : 5000);
    setTimeout(() => el.remove(), kind === 'error' ? 9500 : 5500);
  }

  // ---------------------------------------------------------------- auth and the API

  const sso = window.landfallSignIn;
  // `sso`: the token is an access token from the identity provider, renewed as it expires.
  const auth = { token: sessionStorage.getItem(TOKEN_KEY) || '', who: null, sso: false };

  /** Takes `token=…` from the URL fragment into this tab's session storage, and out of the address bar. */
  function takeTokenFromUrl() {
    const m = location.hash.match(/(^#|[#&?])token=([^&]*)/);
    if (!m) return false;
    const token = decodeURIComponent(m[2]).trim();
    const changed = Boolean(token) && token !== auth.token;
    if (token) {
      useApiToken(token);
    }
    let rest = location.hash.replace(/[#&?]?token=[^&]*/, '').replace(/^#?&/, '#');
    if (!rest || rest === '#') rest = '#/';
    history.replaceState(null, '', location.pathname + location.search + rest);
    return changed;
  }

  /** Signs this tab in with an API token, instead of the identity provider's session if it had one. */
  function useApiToken(token) {
    if (auth.sso || sso.session()) sso.forget();
    auth.sso = false;
    auth.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
  }

  /**
   * After the API refused `used`: whether a token to try again with is at hand, once. Another
   * request may have renewed it already; else the refresh token renews it (single sign-on only).
   */
  async function renewedAfter(used) {
    if (!auth.sso) return false;
    if (auth.token && auth.token !== used) return true;
    try {
      const s = await sso.renew();
      if (!s) return false;
      auth.token = s.access_token;
      return true;
    } catch {
      return false;
    }
  }

  const refusedMessage = () => (auth.sso ? 'Your session has ended: sign in again.' : 'The token was refused: sign in again.');

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, { method = 'GET', body, signal } = {}, again = false) {
    const used = auth.token;
    const headers = { Authorization: `Bearer ${used}`, Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: 'no-store',
    });
    const text = await res.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (res.status === 401) {
      if (!again && (await renewedAfter(used))) return api(path, { method, body, signal }, true);
      if (auth.token === used) signOut(refusedMessage());
      throw new ApiError(401, 'unauthorized', (json && json.message) || 'unauthorized');
    }
    if (!res.ok) {
      throw new ApiError(res.status, (json && json.error) || 'error', (json && json.message) || `${res.status} ${res.statusText}`);
    }
    return json;
  }

  /** Commands this tab sent, so a CommandRejected for one of them is told to its sender. */
  const sentCommands = new Map();

  async function command(kind, body, what) {
    try {
      const res = await api(`/v1/commands/${kind}`, { method: 'POST', body });
      sentCommands.set(res.id, what);
      toast(`${what}: accepted (command ${shortId(res.id)})`, 'ok');
      return res;
    } catch (e) {
      if (e.status !== 401) toast(`${what}: ${e.message}`, 'error');
      return null;
    }
  }

  const OPERATES = new Set(['operator', 'admin']);

  /** Whether a grant's `sites` (labels a site must all have; null for the whole fleet) takes in these labels. */
  function grantCovers(sites, labels) {
    return Object.entries(sites || {}).every(([k, v]) => labels[k] === v);
  }

  /**
   * Whether this person may send commands: an operator (or admin); for a site, given its labels,
   * one whose grants (when /v1/whoami lists them) make them one there.
   */
  function isOperator(labels) {
    if (!auth.who || !OPERATES.has(auth.who.role)) return false;
    if (!labels || !Array.isArray(auth.who.grants)) return true;
    return auth.who.grants.some((g) => OPERATES.has(g.role) && grantCovers(g.sites, labels));
  }

  /**
   * What a person's grants reach, in the API's words: `region=eu-west` (sites with all those
   * labels) or `the whole fleet`, or each grant's role and sites when there are several.
   */
  function scopeText(who) {
    if (!Array.isArray(who.grants)) return '';
    if (!who.grants.length) return 'no sites';
    const sites = (sel) =>
      sel && Object.keys(sel).length
        ? Object.entries(sel)
            .map(([k, v]) => `${k}=${v}`)
            .join(',')
        : 'the whole fleet';
    if (who.grants.length === 1) return sites(who.grants[0].sites);
    return who.grants.map((g) => `${g.role}: ${sites(g.sites)}`).join('; ');
  }

  // ---------------------------------------------------------------- the events stream

  /**
   * Reads /v1/events with fetch() and parses the Server-Sent Events frames. The first request
   * adds `history` to the query (what to replay: `{since}` or `{last}`); a reconnect sends
   * Last-Event-ID instead (the server resumes right after it). Reconnects when nothing arrives,
   * not even the keep-alive comments, for STALL_MS.
   */
  class EventStream {
    constructor(params, history, onEvent, onState) {
      this.params = params;
      this.history = history || {};
      this.onEvent = onEvent;
      this.onState = onState || (() => {});
      this.lastId = null;
      this.stopped = false;
      this.ctrl = null;
      this.stall = null;
    }

    start() {
      this.run();
      return this;
    }

    stop() {
      this.stopped = true;
      clearTimeout(this.stall);
      if (this.ctrl) this.ctrl.abort();
    }

    async run() {
      let delay = 1000;
      let connectedOnce = false;
      let refusedOnce = false;
      while (!this.stopped) {
        this.ctrl = new AbortController();
        try {
          const q = new URLSearchParams(this.params);
          const used = auth.token;
          const headers = { Authorization: `Bearer ${used}`, Accept: 'text/event-stream' };
          if (this.lastId !== null) headers['Last-Event-ID'] = String(this.lastId);
          else for (const [k, v] of Object.entries(this.history)) q.set(k, v);
          const res = await fetch(`/v1/events?${q}`, { headers, signal: this.ctrl.signal, cache: 'no-store' });
          if (res.status === 401) {
            if (!refusedOnce && (await renewedAfter(used))) {
              refusedOnce = true;
              continue;
            }
            if (auth.token === used) signOut(refusedMessage());
            return;
          }
          refusedOnce = false;
          if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
          this.onState('live', connectedOnce);
          connectedOnce = true;
          delay = 1000;
          await this.consume(res.body);
        } catch {
          // Reconnect below.
        }
        clearTimeout(this.stall);
        if (this.stopped) return;
        this.onState('reconnecting');
        await sleep(delay);
        delay = Math.min(delay * 2, 10000);
      }
    }

    armStall() {
      clearTimeout(this.stall);
      this.stall = setTimeout(() => this.ctrl && this.ctrl.abort(), STALL_MS);
    }

    async consume(body) {
      const reader = body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      this.armStall();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        this.armStall();
        buf = (buf + value).replace(/\r\n/g, '\n');
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, end);
          buf = buf.slice(end + 2);
          this.frame(frame);
        }
      }
    }

    frame(text) {
      let id = null;
      let name = 'message';
      const data = [];
      for (const line of text.split('\n')) {
        if (!line || line[0] === ':') continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? '' : line.slice(colon + 1);
        if (value[0] === ' ') value = value.slice(1);
        if (field === 'id') id = value;
        else if (field === 'event') name = value;
        else if (field === 'data') data.push(value);
      }
      if (name === 'error' || !data.length) return;
      if (id !== null && id !== '') {
        const seq = Number(id);
        if (this.lastId !== null && seq <= this.lastId) return;
        if (Number.isFinite(seq)) this.lastId = seq;
      }
      let e;
      try {
        e = JSON.parse(data.join('\n'));
      } catch {
        return;
      }
      e.name = name;
      try {
        this.onEvent(e);
      } catch (err) {
        console.error('event handler', err);
      }
    }
  }

  function setConn(state) {
    const el = $('#conn');
    el.dataset.conn = state;
    $('.conn-text', el).textContent = state;
    el.title = state === 'live' ? 'Receiving events as they happen' : 'The events stream is down; retrying';
  }

  // ---------------------------------------------------------------- what an event says

  function severity(type) {
    if (/Failed|Rejected|Halted/.test(type)) return 'bad';
    if (/Paused|Cancelled|NodeLeft|CutOff$|Disagrees$/.test(type)) return 'warn';
    if (/Installed$|Ready$|Completed$|Patched$|Provisioned$|Applied$|Stored$|Staged$|Restored$/.test(type)) return 'good';
    return 'info';
  }

  const pkg = (p) => (p && p.name ? `${p.name}@${p.version}` : '');

  function summarize(type, ev) {
    const e = ev || {};
    switch (type) {
      case 'SiteRegistered':
        return plural(e.nodes, 'node');
      case 'SiteInstallStarted':
        return `install of ${plural((e.nodes || []).length, 'node')}`;
      case 'NodeOsProvisioning':
        return `${e.node}: ${e.state}`;
      case 'NodeOsProvisioned':
        return `${e.node}: OS ${e.image || ''}`;
      case 'NodeBinariesInstalled':
        return `${e.node}: ${(e.binaries || []).map(pkg).join(', ')}`;
      case 'NodeFailed':
      case 'NodeJoinFailed':
        return `${e.node} at ${e.step}: ${e.reason}`;
      case 'NodeReady':
        return `${e.node} ready`;
      case 'ClusterReady':
        return `${(e.masters || []).length} masters, ${(e.workers || []).length} workers`;
      case 'SiteInstalled':
        return `outcome ${label(String(e.outcome || '').replace(/^INSTALL_OUTCOME_/, '').toLowerCase())}`;
      case 'SiteInstallFailed':
        return e.reason || 'failed';
      case 'PackageRegistered':
        return pkg(e.package);
      case 'NodeCordoned':
        return `${e.node} cordoned`;
      case 'NodeDrained':
        return `${e.node} drained: ${plural((e.evicted || []).length, 'pod')} evicted`;
      case 'NodeUncordoned':
        return `${e.node} uncordoned`;
      case 'NodeRetired':
        return `${e.node}: ${[e.node_deleted && 'Node deleted', e.host_deprovisioned && 'host deprovisioned', e.host_deleted && 'host deleted'].filter(Boolean).join(', ') || 'nothing left to take away'}`;
      case 'SiteTornDown':
        return `${plural((e.hosts || []).length, 'host')} and ${plural((e.resources || []).length, 'resource')} taken away`;
      case 'SiteDecommissioned':
        return `archived as ${e.archive_key}; revoke NATS user ${e.nats_user}`;
      case 'LifecycleFailed':
        return `${e.operation}${e.node ? ` of ${e.node}` : ''}: ${e.reason}`;
      case 'NodePatched':
        return nodePatched(e);
      case 'NodeRolledBack':
        return `${e.node}: rolled back from ${e.failed_version} to ${pkg(e.package)}, healthy again (${e.reason})`;
      case 'NodeRollbackFailed':
        return `${e.node}: rollback to ${pkg(e.package)} failed: ${e.reason}`;
      case 'NodePatchFailed':
        return `${e.node}: ${pkg(e.package)}: ${e.reason}` + heldSteps(e.steps);
      case 'SitePatched': {
        const skipped = (e.skipped || []).length;
        const unchanged = (e.unchanged || []).length;
        const back = (e.failed || []).filter((f) => f.rolled_back).length;
        const nodes = (e.nodes || []).map(nodePatched).join('; ');
        return `${(e.patched || []).length} patched, ${(e.failed || []).length} failed${back ? ` (${back} rolled back)` : ''}${unchanged ? `, ${unchanged} at the version already` : ''}${skipped ? `, ${skipped} left aside` : ''}${nodes ? `: ${nodes}` : ''}`;
      }
      case 'SiteDisagrees':
        return e.reason || '';
      case 'RolloutPlanned':
        return e.rollback_of
          ? `rollback of ${e.rollback_of}: ${e.planned_nodes} nodes back from ${pkg(e.package)} in ${e.waves} waves`
          : `${pkg(e.package)} to ${e.planned_nodes} nodes in ${e.waves} waves`;
      case 'RolloutWaveStarted':
        return `wave ${(e.wave || 0) + 1}${(e.site_ids || []).length ? `: ${plural(e.site_ids.length, 'site')}` : ''}${e.canary ? ' (canary)' : ''}`;
      case 'ContainerPackagesApplied':
        return (e.packages || []).map(pkg).join(', ');
      case 'KubeconfigStored':
        return `sealed with key ${e.key_id}`;
      case 'ArtifactsStaged':
        return `${e.artifacts || 0} artifacts, ${bytes(e.bytes_transferred)} moved, ${bytes(e.bytes_present)} cached`;
      case 'RolloutProgress':
        return `${e.patched || 0}/${e.planned_nodes || 0} patched, ${e.failed || 0} failed`;
      case 'RolloutHalted':
      case 'RolloutPaused':
      case 'RolloutCancelled':
        return e.reason || '';
      case 'RolloutCompleted':
        return `${pkg(e.package)}: ${e.patched || 0} patched, ${e.failed || 0} failed`;
      case 'SiteCutOff': {
        const waiting = Number(e.outbox_waiting || 0);
        return `nothing heard since ${clock(unixMs(e.since_unix_ms))}${waiting ? `, ${plural(waiting, 'report')} waiting at the site` : ''}`;
      }
      case 'SiteLinkRestored':
        return `heard again after ${duration(unixMs(e.cut_off_since_unix_ms), unixMs(e.restored_unix_ms))} cut off`;
      case 'CommandRejected':
      case 'MessageRejected':
        return `${String(e.command_type || e.message_type || '').replace(/^landfall\.v1\./, '')}: ${e.reason}`;
      default:
        break;
    }
    const parts = [];
    for (const [k, v] of Object.entries(e)) {
      if (k === 'site_id' || v === '' || v === null || v === 0 || v === false) continue;
      if (Array.isArray(v)) {
        if (v.length) parts.push(`${label(k)} ${v.length}`);
      } else if (typeof v === 'object') {
        if (v.name && v.version) parts.push(pkg(v));
      } else if (k === 'rollout_id') {
        parts.push(`rollout ${shortId(v)}`);
      } else {
        parts.push(`${label(k)} ${v}`);
      }
    }
    return parts.slice(0, 4).join(', ');
  }

  function eventItem(e, withSite) {
    const type = e.name || String(e.type || '').split('.').pop();
    const site = e.site && e.site !== 'fleet' ? e.site : null;
    const rollout = e.event && e.event.rollout_id;
    return h(
      'li',
      { class: `ev ev-${severity(type)}`, dataset: { seq: e.seq, type, site: e.site || '' } },
      h('time', { class: 'ev-time', datetime: e.time, title: fullTime(e.time) }, clock(e.time)),
      h(
        'div',
        { class: 'ev-body' },
        h(
          'div',
          { class: 'ev-head' },
          h('span', { class: 'ev-type' }, type),
          withSite && site ? h('a', { class: 'ev-site', href: `#/sites/${encodeURIComponent(site)}` }, site) : null,
          !site && rollout ? h('a', { class: 'ev-site', href: `#/rollouts/${rollout}` }, `rollout ${shortId(rollout)}`) : null,
        ),
        h('div', { class: 'ev-summary' }, summarize(type, e.event)),
      ),
    );
  }

  // ---------------------------------------------------------------- the live feed

  const feed = {
    queue: [],
    scheduled: false,
    total: 0,
    push(e) {
      this.total += 1;
      this.queue.push(e);
      if (this.queue.length > FEED_MAX) this.queue.splice(0, this.queue.length - FEED_MAX);
      if (!this.scheduled) {
        this.scheduled = true;
        setTimeout(() => requestAnimationFrame(() => this.render()), 200);
      }
    },
    render() {
      this.scheduled = false;
      const list = $('#feed');
      const items = this.queue.splice(0).reverse().map((e) => eventItem(e, true));
      list.prepend(...items);
      while (list.childElementCount > FEED_MAX) list.lastElementChild.remove();
      const empty = $('.feed-empty', list);
      if (empty && list.childElementCount > 1) empty.remove();
      $('#feed-count').textContent = `${num(this.total)} events`;
    },
  };

  // ---------------------------------------------------------------- live refresh

  /** What the events made stale, fetched again by `flush` at a measured pace. */
  const stale = {
    sites: new Set(),
    page: false,
    overview: false,
    rollouts: false,
    packages: false,
    timer: null,
    settleTimer: null,
    lastRows: 0,
    lastSummary: 0,
    running: false,
  };

  function scheduleFlush() {
    if (stale.timer) return;
    const wait = Math.max(0, stale.lastRows + ROWS_EVERY_MS - Date.now());
    stale.timer = setTimeout(flush, wait);
  }

  function markAll() {
    stale.page = true;
    stale.overview = true;
    stale.rollouts = true;
    stale.packages = true;
    if (view && view.site) stale.sites.add(view.site);
    scheduleFlush();
  }

  async function flush() {
    stale.timer = null;
    if (stale.running) {
      scheduleFlush();
      return;
    }
    stale.running = true;
    stale.lastRows = Date.now();
    const jobs = [];
    try {
      if (view && view.refreshSites) {
        const sites = stale.sites;
        stale.sites = new Set();
        const page = stale.page;
        stale.page = false;
        jobs.push(view.refreshSites(sites, page));
      } else {
        stale.sites.clear();
        stale.page = false;
      }
      const now = Date.now();
      if (now - stale.lastSummary >= SUMMARY_EVERY_MS) {
        stale.lastSummary = now;
        if (stale.overview && view && view.refreshOverview) {
          stale.overview = false;
          jobs.push(view.refreshOverview());
        }
        if (stale.rollouts && view && view.refreshRollouts) {
          stale.rollouts = false;
          jobs.push(view.refreshRollouts());
        }
        if (stale.packages && view && view.refreshPackages) {
          stale.packages = false;
          jobs.push(view.refreshPackages());
        }
      }
      await Promise.allSettled(jobs);
    } finally {
      stale.running = false;
    }
    const pending =
      stale.sites.size || stale.page || (view && ((stale.overview && view.refreshOverview) || (stale.rollouts && view.refreshRollouts)));
    if (pending) scheduleFlush();
  }

  const ROLLOUT_TYPES = /^Rollout|^NodePatch|^SitePatched$/;
  const MEMBERSHIP_TYPES = /^(SiteRegistered|DesignApplied|NodeAccepted|NodeLeft)$/;
  const STATE_TYPES = /^(SiteInstallStarted|SiteInstalled|SiteInstallFailed)$/;

  function onEvent(e) {
    feed.push(e);
    const type = e.name;
    const site = e.site && e.site !== 'fleet' ? e.site : null;
    if (site) stale.sites.add(site);
    if (MEMBERSHIP_TYPES.test(type) && view && view.pageHas && !view.pageHas(site)) stale.page = true;
    if (STATE_TYPES.test(type) && view && view.filtered && view.filtered()) stale.page = true;
    stale.overview = true;
    if (ROLLOUT_TYPES.test(type)) stale.rollouts = true;
    if (type === 'PackageRegistered') stale.packages = true;
    if (type === 'CommandRejected' && e.event) {
      const what = sentCommands.get(e.correlation_id) || sentCommands.get(e.event.command_id);
      if (what) toast(`${what}: rejected: ${e.event.reason}`, 'error');
    }
    scheduleFlush();
    // Once the events stop, everything on screen is read once more: the read model trails the
    // events it is built from by a little, and this catches its last writes.
    clearTimeout(stale.settleTimer);
    stale.settleTimer = setTimeout(markAll, SETTLE_MS);
  }

  // ---------------------------------------------------------------- views

  let view = null;

  function mount(next) {
    if (view && view.unmount) view.unmount();
    view = next;
    const root = $('#view');
    fill(root, view.el);
    document.title = view.title ? `${view.title} · landfall` : 'landfall';
    for (const a of document.querySelectorAll('[data-nav]')) {
      if (a.dataset.nav === view.nav) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
  }

  function errorBox(e) {
    return h('div', { class: 'notice notice-error', role: 'alert' }, e.message || String(e));
  }

  function progressBar(done, failed, total, labelText) {
    const t = Math.max(Number(total) || 0, 1);
    const ok = Math.min(100, (100 * (Number(done) || 0)) / t);
    const bad = Math.min(100 - ok, (100 * (Number(failed) || 0)) / t);
    return h(
      'div',
      {
        class: 'progress',
        role: 'progressbar',
        'aria-label': labelText,
        'aria-valuemin': 0,
        'aria-valuemax': total || 0,
        'aria-valuenow': done || 0,
      },
      h('span', { class: 'progress-ok', style: { width: `${ok}%` } }),
      h('span', { class: 'progress-bad', style: { width: `${bad}%` } }),
    );
  }

  function versionChips(versions) {
    const names = Object.keys(versions || {});
    if (!names.length) return h('span', { class: 'muted' }, '—');
    return h(
      'div',
      { class: 'chips' },
      names.map((name) => {
        const vs = versions[name] || [];
        const mixed = vs.length > 1;
        return h(
          'span',
          { class: mixed ? 'chip chip-mixed' : 'chip', title: mixed ? `${name}: nodes run ${vs.join(', ')}` : `${name} ${vs[0] || ''}`, dataset: { pkg: name } },
          h('span', { class: 'chip-name' }, name),
          ' ',
          vs.join(' / '),
        );
      }),
    );
  }

  // ------------------------------------------------ the fleet: overview tiles and the sites table

  const fleetQuery = { state: '', q: '', link: '', offset: 0 };

  function fleetView() {
    const tiles = h('section', { class: 'tiles', id: 'overview', 'aria-label': 'Fleet overview' });
    const rolloutsCard = h('section', { class: 'card', id: 'rollouts-card', 'aria-labelledby': 'rollouts-card-title', hidden: true });
    const search = h('input', {
      id: 'site-search',
      type: 'search',
      placeholder: 'Search sites…',
      value: fleetQuery.q,
      autocomplete: 'off',
      spellcheck: 'false',
    });
    const stateSelect = h(
      'select',
      { id: 'state-filter' },
      h('option', { value: '' }, 'All states'),
      SITE_STATES.map((s) => h('option', { value: s, selected: fleetQuery.state === s }, label(s))),
    );
    const pageInfo = h('span', { id: 'page-info', class: 'page-info', 'aria-live': 'polite' });
    const prev = h('button', { class: 'btn btn-small', type: 'button', id: 'page-prev', 'aria-label': 'Previous page' }, '‹ Prev');
    const next = h('button', { class: 'btn btn-small', type: 'button', id: 'page-next', 'aria-label': 'Next page' }, 'Next ›');
    const tbody = h('tbody');
    const table = h(
      'table',
      { class: 'table sites', id: 'sites-table' },
      h('caption', { class: 'sr-only' }, 'Sites, one page at a time'),
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          ['Site', 'State', 'Nodes ready', 'Failed', 'Versions', 'Busy', 'Last event'].map((t) => h('th', { scope: 'col' }, t)),
        ),
      ),
      tbody,
    );
    const status = h('div', { class: 'table-status', id: 'sites-status' });
    const el = h(
      'div',
      { class: 'fleet' },
      h('div', { class: 'page-head' }, h('h1', {}, 'Fleet'), h('span', { id: 'model-state', class: 'muted small' })),
      tiles,
      rolloutsCard,
      h(
        'section',
        { class: 'card', 'aria-labelledby': 'sites-title' },
        h(
          'div',
          { class: 'card-head toolbar' },
          h('h2', { id: 'sites-title' }, 'Sites'),
          h('label', { class: 'sr-only', for: 'site-search' }, 'Search sites by id'),
          search,
          h('label', { class: 'sr-only', for: 'state-filter' }, 'Filter by state'),
          stateSelect,
          h('div', { class: 'pager' }, pageInfo, prev, next),
        ),
        h('div', { class: 'table-wrap' }, table),
        status,
      ),
    );

    const rows = new Map();
    let page = { total: 0, offset: 0, items: [] };
    let seq = 0;
    let searchTimer = null;

    function siteRow(s) {
      const installing = s.install && s.state === 'installing' ? s.install.phase : '';
      const failedReason = s.install && s.install.reason && (s.state === 'failed' || s.state === 'degraded') ? s.install.reason : '';
      const le = s.last_event;
      return h(
        'tr',
        { dataset: { site: s.site, state: s.state, busy: s.busy || '' } },
        h(
          'th',
          { scope: 'row' },
          h('a', { href: `#/sites/${encodeURIComponent(s.site)}`, class: 'site-link' }, s.site),
          Object.keys(s.labels || {}).length
            ? h('div', { class: 'labels' }, Object.entries(s.labels).map(([k, v]) => h('span', { class: 'label' }, `${k}=${v}`)))
            : null,
        ),
        h(
          'td',
          { dataset: { field: 'state' } },
          badge('state', s.state),
          cutOff(s) ? h('span', { class: 'badge link-cut_off', dataset: { link: 'cut_off' }, title: linkText(s.link) }, 'cut off') : null,
          cutOff(s) ? h('div', { class: 'sub sub-warn' }, 'since ', ago(s.link.since)) : null,
          installing ? h('div', { class: 'sub' }, label(installing)) : null,
          failedReason ? h('div', { class: 'sub sub-bad', title: failedReason }, failedReason) : null,
          (s.attention || []).length
            ? h('div', { class: 'sub sub-warn', dataset: { attention: s.attention.map((a) => a.kind).join(' ') }, title: s.attention.map((a) => a.reason).join('\n') }, 'needs attention')
            : null,
        ),
        h(
          'td',
          { dataset: { field: 'nodes' }, class: 'num' },
          h('span', { class: 'ratio' }, `${s.nodes_ready}/${s.nodes}`),
          progressBar(s.nodes_ready, s.nodes_failed, s.nodes, `${s.nodes_ready} of ${s.nodes} nodes ready`),
        ),
        h('td', { dataset: { field: 'failed' }, class: s.nodes_failed ? 'num bad' : 'num muted' }, String(s.nodes_failed)),
        h('td', { dataset: { field: 'versions' } }, versionChips(s.versions)),
        h('td', { dataset: { field: 'busy' } }, s.busy ? badge('busy', s.busy) : h('span', { class: 'muted' }, '—')),
        h(
          'td',
          { dataset: { field: 'last-event' }, class: 'last-event' },
          le ? h('div', { class: `ev-type ev-${severity(le.type)}`, title: le.summary }, le.type) : h('span', { class: 'muted' }, '—'),
          le ? ago(le.time) : null,
        ),
      );
    }

    function renderPage() {
      rows.clear();
      const trs = page.items.map((s) => {
        const tr = siteRow(s);
        rows.set(s.site, tr);
        return tr;
      });
      fill(tbody, ...trs);
      const from = page.total ? page.offset + 1 : 0;
      const to = page.offset + page.items.length;
      pageInfo.textContent = `${num(from)}–${num(to)} of ${num(page.total)}`;
      pageInfo.dataset.total = page.total;
      prev.disabled = page.offset <= 0;
      next.disabled = to >= page.total;
      table.dataset.total = page.total;
      if (!page.items.length) {
        fill(status, 
          h('p', { class: 'muted pad' }, fleetQuery.q || fleetQuery.state ? 'No site matches.' : 'No sites registered yet.'),
        );
      } else {
        status.replaceChildren();
      }
    }

    async function loadPage() {
      const mine = ++seq;
      const q = new URLSearchParams({ limit: PAGE_SIZE, offset: fleetQuery.offset });
      if (fleetQuery.state) q.set('state', fleetQuery.state);
      if (fleetQuery.q) q.set('q', fleetQuery.q);
      if (fleetQuery.link) q.set('link', fleetQuery.link);
      try {
        const res = await api(`/v1/sites?${q}`);
        if (mine !== seq) return;
        if (res.total && res.offset >= res.total) {
          fleetQuery.offset = Math.max(0, Math.floor((res.total - 1) / PAGE_SIZE) * PAGE_SIZE);
          await loadPage();
          return;
        }
        page = res;
        renderPage();
      } catch (e) {
        if (mine === seq && e.status !== 401) fill(status, errorBox(e));
      }
    }

    async function refreshRows(sites) {
      const ids = [...sites].filter((s) => rows.has(s));
      if (!ids.length) return;
      const res = await api(`/v1/sites?ids=${encodeURIComponent(ids.join(','))}&limit=${Math.min(1000, ids.length)}`);
      for (const s of res.items) {
        const old = rows.get(s.site);
        if (!old) continue;
        // A row whose state no longer matches the filter stays until the page is read again.
        const tr = siteRow(s);
        old.replaceWith(tr);
        rows.set(s.site, tr);
        const i = page.items.findIndex((x) => x.site === s.site);
        if (i >= 0) page.items[i] = s;
      }
    }

    function tile(key, title, value, opts = {}) {
      const attrs = {
        class: `tile ${opts.cls || ''}`,
        dataset: { tile: key, value: String(value) },
      };
      const body = [
        h('span', { class: 'tile-label' }, title),
        h('span', { class: 'tile-value' }, num(value)),
        opts.sub ? h('span', { class: 'tile-sub' }, opts.sub) : null,
        opts.bar !== undefined ? h('span', { class: 'tile-bar' }, h('span', { style: { width: `${opts.bar}%` } })) : null,
      ];
      if (opts.link !== undefined) {
        return h(
          'button',
          {
            ...attrs,
            type: 'button',
            'aria-pressed': String(fleetQuery.link === opts.link),
            title: 'Show the sites the hub does not hear',
            onclick: () => {
              fleetQuery.link = fleetQuery.link === opts.link ? '' : opts.link;
              fleetQuery.offset = 0;
              loadPage();
              refreshOverview();
            },
          },
          body,
        );
      }
      if (opts.state !== undefined) {
        return h(
          'button',
          {
            ...attrs,
            type: 'button',
            'aria-pressed': String(fleetQuery.state === opts.state),
            title: `Show ${label(opts.state)} sites`,
            onclick: () => setState(fleetQuery.state === opts.state ? '' : opts.state),
          },
          body,
        );
      }
      return h(opts.href ? 'a' : 'div', { ...attrs, href: opts.href }, body);
    }

    function renderOverview(o) {
      const total = o.sites.total;
      const share = (n) => (total ? Math.round((100 * n) / total) : 0);
      const nodes = o.nodes;
      const running = o.rollouts.by_phase.running + o.rollouts.by_phase.paused;
      fill(tiles, 
        tile('sites-total', 'Sites', total, { cls: 'tile-total', sub: `${num(o.sites.busy)} busy` }),
        SITE_STATES.map((s) =>
          tile(`state-${s}`, label(s), o.sites.by_state[s] || 0, { cls: `tile-state state-${s}`, state: s, bar: share(o.sites.by_state[s] || 0) }),
        ),
        tile('sites-cut-off', 'Cut off', o.sites.cut_off || 0, {
          cls: `tile-link${o.sites.cut_off ? ' tile-warn' : ''}`,
          sub: 'not heard from',
          link: 'cut_off',
          bar: share(o.sites.cut_off || 0),
        }),
        tile('nodes-ready', 'Nodes ready', nodes.by_step.ready || 0, {
          cls: 'tile-nodes',
          sub: `of ${num(nodes.total)} · ${num(nodes.by_step.failed || 0)} failed`,
          bar: nodes.total ? Math.round((100 * (nodes.by_step.ready || 0)) / nodes.total) : 0,
        }),
        tile('rollouts-active', 'Rollouts', running, {
          cls: 'tile-rollouts',
          sub: `active${o.rollouts.by_phase.halted ? ` · ${num(o.rollouts.by_phase.halted)} halted` : ''} · ${num(o.rollouts.total)} total`,
          href: '#/rollouts',
        }),
      );
      $('#model-state', el).textContent = o.ready ? '' : 'catching up with the bus…';
    }

    async function refreshOverview() {
      try {
        renderOverview(await api('/v1/overview'));
      } catch {
        // Shown by the next refresh, or by the sign-in form.
      }
    }

    async function refreshRollouts() {
      try {
        const all = await api('/v1/rollouts');
        const active = all.filter((r) => r.phase === 'running' || r.phase === 'paused' || r.phase === 'halted');
        const shown = (active.length ? active : all).slice(0, 4);
        rolloutsCard.hidden = !shown.length;
        fill(rolloutsCard, 
          h(
            'div',
            { class: 'card-head' },
            h('h2', { id: 'rollouts-card-title' }, active.length ? 'Active rollouts' : 'Recent rollouts'),
            h('a', { href: '#/rollouts', class: 'small' }, `All ${num(all.length)} rollouts →`),
          ),
          h('div', { class: 'rollout-list' }, shown.map(rolloutCard)),
        );
      } catch {
        // As above.
      }
    }

    function setState(s) {
      fleetQuery.state = s;
      fleetQuery.offset = 0;
      stateSelect.value = s;
      for (const b of tiles.querySelectorAll('button[data-tile]')) {
        b.setAttribute('aria-pressed', String(b.dataset.tile === `state-${s}`));
      }
      loadPage();
    }

    search.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => {
        fleetQuery.q = search.value.trim().toLowerCase();
        fleetQuery.offset = 0;
        loadPage();
      }, 200);
    });
    stateSelect.addEventListener('change', () => setState(stateSelect.value));
    prev.addEventListener('click', () => {
      fleetQuery.offset = Math.max(0, fleetQuery.offset - PAGE_SIZE);
      loadPage();
    });
    next.addEventListener('click', () => {
      fleetQuery.offset += PAGE_SIZE;
      loadPage();
    });

    loadPage();
    refreshOverview();
    refreshRollouts();
    return {
      el,
      nav: 'fleet',
      title: 'Fleet',
      pageHas: (site) => rows.has(site),
      filtered: () => Boolean(fleetQuery.state || fleetQuery.link),
      refreshSites: (sites, wholePage) => (wholePage ? loadPage() : refreshRows(sites)),
      refreshOverview,
      refreshRollouts,
    };
  }

  // ------------------------------------------------ one site

  function siteView(site) {
    const el = h('div', { class: 'site-page', id: 'site-page', dataset: { site } }, h('p', { class: 'muted pad' }, 'Loading…'));
    const timeline = h('ol', { class: 'feed timeline', id: 'site-timeline' });
    let stream = null;
    let detail = null;
    let seq = 0;
    let confirmReinstall = false;
    // Node → the Metal3 state its latest NodeOsProvisioning said, with that event's sequence:
    // drawn at once, and over what the read model says until the read model has that event too
    // (a reimage's deprovisioning can be over before the next read of the site).
    const liveMetal3 = new Map();

    /** The Metal3 state to draw for node `n` of the site read as `s`. */
    function metal3Of(s, n) {
      const live = liveMetal3.get(n.name);
      if (!live) return n.metal3_state;
      if (live.seq > ((s.last_event && s.last_event.seq) || 0)) return live.state;
      liveMetal3.delete(n.name);
      return n.metal3_state;
    }

    function metal3Cell(state) {
      return state ? h('span', { class: 'metal3' }, state) : h('span', { class: 'muted' }, '—');
    }

    /** A NodeOsProvisioning of this site: its node's row shows the state now. */
    function onMetal3(e) {
      const ev = e.event || {};
      if (!ev.node || !ev.state || ev.site_id !== site || !Number.isFinite(e.seq)) return;
      const known = liveMetal3.get(ev.node);
      if (known && known.seq >= e.seq) return;
      if (detail && detail.last_event && detail.last_event.seq >= e.seq) return;
      liveMetal3.set(ev.node, { state: ev.state, seq: e.seq });
      const row = [...el.querySelectorAll('#nodes-table tbody tr[data-node]')].find((r) => r.dataset.node === ev.node);
      if (!row) return;
      row.dataset.metal3 = ev.state;
      const cell = row.querySelector('td[data-field="metal3"]');
      if (cell) fill(cell, metal3Cell(ev.state));
    }

    function installButton(s) {
      if (!isOperator(s.labels || {})) return null;
      const busy = Boolean(s.busy);
      const again = s.state !== 'registered';
      const btn = h(
        'button',
        {
          type: 'button',
          id: 'install-btn',
          class: again ? 'btn' : 'btn btn-primary',
          dataset: { action: 'install' },
          disabled: busy,
          title: busy ? `The site is busy (${s.busy})` : again ? 'Install the site again from its design' : 'Install the site from its design',
        },
        confirmReinstall ? 'Confirm reinstall' : again ? 'Reinstall' : 'Install',
      );
      btn.addEventListener('click', async () => {
        if (again && !confirmReinstall) {
          confirmReinstall = true;
          btn.textContent = 'Confirm reinstall';
          setTimeout(() => {
            confirmReinstall = false;
            if (btn.isConnected) btn.textContent = 'Reinstall';
          }, 5000);
          return;
        }
        confirmReinstall = false;
        btn.disabled = true;
        btn.textContent = 'Requesting…';
        const res = await command('install_site', { site_id: site }, `Install ${site}`);
        if (!res && btn.isConnected) {
          btn.disabled = false;
          btn.textContent = again ? 'Reinstall' : 'Install';
        }
        stale.sites.add(site);
        scheduleFlush();
      });
      return btn;
    }

    function packageCell(n) {
      if (!n.packages.length) return h('span', { class: 'muted' }, '—');
      return h(
        'div',
        { class: 'chips' },
        n.packages.map((p) =>
          h(
            'span',
            {
              class: p.differs ? 'chip chip-differs' : 'chip',
              dataset: { pkg: p.name, differs: String(Boolean(p.differs)) },
              title: p.differs ? `${p.name} runs ${p.version}; the design wants ${p.desired}` : `${p.name} ${p.version} (${p.kind})`,
            },
            h('span', { class: 'chip-name' }, p.name),
            ' ',
            p.version,
            p.differs ? h('span', { class: 'chip-desired' }, ` → ${p.desired}`) : null,
          ),
        ),
      );
    }

    function render(s) {
      const inst = s.install;
      const differing = s.node_list.reduce((n, node) => n + node.packages.filter((p) => p.differs).length, 0);
      const facts = [
        ['Nodes ready', h('span', { dataset: { field: 'nodes-ready' } }, `${s.nodes_ready}/${s.nodes}`)],
        ['Failed nodes', h('span', { dataset: { field: 'nodes-failed' }, class: s.nodes_failed ? 'bad' : '' }, String(s.nodes_failed))],
        ['Busy', s.busy ? badge('busy', s.busy) : h('span', { class: 'muted' }, 'no')],
        ['Last event', s.last_event ? h('span', {}, s.last_event.type, ' ', ago(s.last_event.time)) : h('span', { class: 'muted' }, '—')],
        [
          'Link',
          !s.link
            ? h('span', { class: 'muted', dataset: { field: 'link' } }, 'never heard')
            : cutOff(s)
              ? h('span', { class: 'warn', dataset: { field: 'link', link: 'cut_off' } }, 'cut off since ', ago(s.link.since))
              : h('span', { dataset: { field: 'link', link: 'up' } }, 'up since ', ago(s.link.since)),
        ],
      ];
      const installFacts = inst
        ? [
            ['Phase', h('span', { dataset: { field: 'install-phase' } }, label(inst.phase))],
            ['Outcome', inst.outcome ? badge('outcome', inst.outcome) : h('span', { class: 'muted' }, 'not yet')],
            ['Started', ago(inst.started)],
            ['Took', h('span', {}, inst.started ? duration(inst.started, inst.finished) + (inst.finished ? '' : ' so far') : '—')],
            ['Install', h('code', { title: inst.id }, shortId(inst.id))],
          ]
        : [];
      el.dataset.state = s.state;
      el.dataset.busy = s.busy || '';
      fill(el, 
        h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/' }, 'Fleet'), ' / ', h('span', {}, s.site)),
        h(
          'div',
          { class: 'page-head' },
          h('h1', {}, s.site),
          h('span', { id: 'site-state', dataset: { field: 'state', state: s.state } }, badge('state', s.state)),
          s.busy ? badge('busy', s.busy) : null,
          h('div', { class: 'labels' }, Object.entries(s.labels || {}).map(([k, v]) => h('span', { class: 'label' }, `${k}=${v}`))),
          h('div', { class: 'spacer' }),
          installButton(s),
        ),
        cutOff(s)
          ? h(
              'div',
              { class: 'notice notice-warn', id: 'link-notice', role: 'status', dataset: { link: 'cut_off', since: s.link.since } },
              h('strong', {}, 'Cut off: '),
              linkText(s.link),
            )
          : null,
        (s.attention || []).map((a) =>
          h('div', { class: 'notice notice-warn attention-notice', role: 'status', dataset: { attention: a.kind } }, h('strong', {}, 'Needs attention: '), a.reason),
        ),
        inst && inst.reason
          ? h(
              'div',
              { class: `notice ${s.state === 'failed' ? 'notice-error' : 'notice-warn'}`, id: 'install-reason', role: 'status' },
              h('strong', {}, 'Install: '),
              inst.reason,
            )
          : null,
        h(
          'div',
          { class: 'grid-2' },
          h('section', { class: 'card', 'aria-labelledby': 'site-summary' }, h('div', { class: 'card-head' }, h('h2', { id: 'site-summary' }, 'Summary')), factList(facts)),
          h(
            'section',
            { class: 'card', 'aria-labelledby': 'site-install', id: 'install-card' },
            h('div', { class: 'card-head' }, h('h2', { id: 'site-install' }, 'Latest install')),
            inst ? factList(installFacts) : h('p', { class: 'muted pad' }, 'Never installed.'),
          ),
        ),
        h(
          'section',
          { class: 'card', 'aria-labelledby': 'site-versions' },
          h(
            'div',
            { class: 'card-head' },
            h('h2', { id: 'site-versions' }, 'Versions'),
            differing ? h('span', { class: 'pill pill-warn' }, `${differing} differ from the design`) : null,
          ),
          h('div', { class: 'pad' }, versionChips(s.versions)),
        ),
        h(
          'section',
          { class: 'card', 'aria-labelledby': 'site-nodes' },
          h('div', { class: 'card-head' }, h('h2', { id: 'site-nodes' }, `Nodes (${s.node_list.length})`)),
          h(
            'div',
            { class: 'table-wrap' },
            h(
              'table',
              { class: 'table nodes', id: 'nodes-table' },
              h('caption', { class: 'sr-only' }, `Nodes of ${s.site}`),
              h(
                'thead',
                {},
                h('tr', {}, ['Node', 'Role', 'Step', 'Metal3', 'Packages', 'Failure', 'Boot MAC / BMC'].map((t) => h('th', { scope: 'col' }, t))),
              ),
              h(
                'tbody',
                {},
                s.node_list.map((n) => {
                  const metal3 = metal3Of(s, n);
                  return h(
                    'tr',
                    { dataset: { node: n.name, step: n.step, metal3: metal3 || '' } },
                    h(
                      'th',
                      { scope: 'row' },
                      n.name,
                      n.in_design ? null : h('span', { class: 'pill pill-warn', title: 'The site reported this node; the design does not have it' }, 'not in design'),
                      n.out_of_service ? h('span', { class: 'pill pill-warn', title: 'Taken out of service for a patch or a reprovision' }, n.out_of_service) : null,
                    ),
                    h('td', {}, label(n.role)),
                    h('td', { dataset: { field: 'step' } }, badge('step', n.step)),
                    h('td', { dataset: { field: 'metal3' } }, metal3Cell(metal3)),
                    h('td', {}, packageCell(n)),
                    h(
                      'td',
                      { class: n.reason ? 'bad' : '' },
                      n.failed_step || n.reason ? `${n.failed_step ? `${label(n.failed_step)}: ` : ''}${n.reason}` : h('span', { class: 'muted' }, '—'),
                    ),
                    h('td', { class: 'mono small' }, h('div', {}, n.boot_mac), h('div', { class: 'muted' }, n.bmc_address)),
                  );
                }),
              ),
            ),
          ),
        ),
        h(
          'section',
          { class: 'card', 'aria-labelledby': 'site-events' },
          h('div', { class: 'card-head' }, h('h2', { id: 'site-events' }, 'Events'), h('span', { class: 'muted small' }, 'last 24 hours, newest first')),
          timeline,
        ),
      );
    }

    async function load() {
      const mine = ++seq;
      try {
        const [s, charts] = await Promise.all([
          api(`/v1/sites/${encodeURIComponent(site)}`),
          api(`/v1/sites/${encodeURIComponent(site)}/charts`).catch(() => []),
        ]);
        if (mine !== seq) return;
        detail = s;
        render(s);
        if (charts.length) el.append(chartsCard(charts));
      } catch (e) {
        if (mine !== seq || e.status === 401) return;
        if (e.status === 404) {
          // Not registered, or outside what this person may see: the same to them.
          if (stream) stream.stop();
          detail = null;
          el.dataset.state = 'not_found';
          fill(
            el,
            h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/' }, 'Fleet'), ' / ', h('span', {}, site)),
            h('div', { class: 'page-head' }, h('h1', {}, 'Site not found')),
            h('div', { class: 'notice notice-warn', id: 'site-not-found', role: 'alert' }, e.message),
          );
          return;
        }
        if (!detail) fill(el, h('nav', { class: 'crumbs' }, h('a', { href: '#/' }, 'Fleet')), errorBox(e));
      }
    }

    const pendingTimeline = [];
    let timelineScheduled = false;
    function onSiteEvent(e) {
      if (e.name === 'NodeOsProvisioning') onMetal3(e);
      pendingTimeline.push(e);
      if (pendingTimeline.length > TIMELINE_MAX) pendingTimeline.splice(0, pendingTimeline.length - TIMELINE_MAX);
      if (timelineScheduled) return;
      timelineScheduled = true;
      requestAnimationFrame(() => {
        timelineScheduled = false;
        timeline.prepend(...pendingTimeline.splice(0).reverse().map((x) => eventItem(x, false)));
        while (timeline.childElementCount > TIMELINE_MAX) timeline.lastElementChild.remove();
      });
    }

    load();
    stream = new EventStream({ site }, { since: new Date(Date.now() - SITE_HISTORY_MS).toISOString() }, onSiteEvent).start();
    return {
      el,
      nav: 'fleet',
      title: site,
      site,
      refreshSites: (sites) => (sites.has(site) ? load() : Promise.resolve()),
      unmount: () => stream && stream.stop(),
    };
  }

  // The helm charts rendered for a site: what each render was made of.
  function chartsCard(charts) {
    const short = (hex) => h('code', { title: hex }, `${hex.slice(0, 12)}…`);
    return h(
      'section',
      { class: 'card', 'aria-labelledby': 'site-charts', id: 'charts' },
      h('div', { class: 'card-head' }, h('h2', { id: 'site-charts' }, 'Helm charts'), h('span', { class: 'muted small' }, 'the latest render made for this site')),
      h(
        'div',
        { class: 'table-wrap' },
        h(
          'table',
          { class: 'table' },
          h('caption', { class: 'sr-only' }, 'Helm charts rendered for this site'),
          h('thead', {}, h('tr', {}, ['Chart', 'Version', 'Chart sha256', 'Values sha256', 'Helm', 'Kubernetes', 'Rendered'].map((t) => h('th', { scope: 'col' }, t)))),
          h(
            'tbody',
            {},
            charts.map((c) =>
              h(
                'tr',
                { dataset: { chart: c.name } },
                h('th', { scope: 'row' }, c.name),
                h('td', {}, c.version),
                h('td', {}, short(c.chart_sha256)),
                h('td', {}, short(c.values_digest)),
                h('td', {}, c.helm_version),
                h('td', {}, c.kube_version || '—'),
                h('td', {}, ago(new Date(c.rendered_at_ms).toISOString())),
              ),
            ),
          ),
        ),
      ),
    );
  }

  function factList(facts) {
    return h('dl', { class: 'facts' }, facts.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
  }

  // ------------------------------------------------ rollouts

  function rolloutCard(r) {
    const done = r.patched + r.failed;
    return h(
      'a',
      { class: `rollout phase-${r.phase}`, href: `#/rollouts/${r.id}`, dataset: { rollout: r.id, phase: r.phase } },
      h(
        'div',
        { class: 'rollout-head' },
        h('span', { class: 'rollout-pkg' }, `${r.package}@${r.version}`),
        badge('phase', r.phase),
        h('span', { class: 'muted small' }, `wave ${r.wave}/${r.waves}`),
      ),
      progressBar(r.patched, r.failed, r.planned_nodes, `${r.patched} of ${r.planned_nodes} nodes patched`),
      h(
        'div',
        { class: 'rollout-meta small' },
        h('span', {}, `${num(done)}/${num(r.planned_nodes)} nodes`),
        r.failed ? h('span', { class: 'bad' }, `${num(r.failed)} failed`) : null,
        h('span', { class: 'muted' }, `${num(r.sites_done)}/${num(r.sites)} sites`),
        h('span', { class: 'muted' }, 'started ', ago(r.started), r.actor ? [' by ', actorName(r.actor)] : null),
      ),
      r.reason ? h('div', { class: `rollout-reason ${r.phase === 'halted' ? 'bad' : 'warn'}` }, r.reason) : null,
    );
  }

  /** Who started a rollout (`actor`, e.g. `user:alice`), as the API names them. */
  function actorName(actor) {
    return h('span', { class: 'actor', dataset: { actor } }, actor);
  }

  function rolloutsView() {
    const el = h('div', {}, h('div', { class: 'page-head' }, h('h1', {}, 'Rollouts')), h('p', { class: 'muted pad' }, 'Loading…'));
    async function refreshRollouts() {
      try {
        const all = await api('/v1/rollouts');
        const counts = Object.fromEntries(ROLLOUT_PHASES.map((p) => [p, all.filter((r) => r.phase === p).length]));
        // Rollouts name their author once the API records one.
        const authors = all.some((r) => r.actor);
        fill(el, 
          h(
            'div',
            { class: 'page-head' },
            h('h1', {}, 'Rollouts'),
            ROLLOUT_PHASES.filter((p) => counts[p]).map((p) => badge('phase', p, ` ${counts[p]}`)),
          ),
          all.length
            ? h(
                'section',
                { class: 'card' },
                h(
                  'div',
                  { class: 'table-wrap' },
                  h(
                    'table',
                    { class: 'table', id: 'rollouts-table' },
                    h('caption', { class: 'sr-only' }, 'Rollouts, newest first'),
                    h(
                      'thead',
                      {},
                      h(
                        'tr',
                        {},
                        ['Package', 'Phase', 'Progress', 'Nodes', 'Sites', 'Wave', 'Trigger', authors ? 'By' : null, 'Started', 'Reason']
                          .filter(Boolean)
                          .map((t) => h('th', { scope: 'col' }, t)),
                      ),
                    ),
                    h(
                      'tbody',
                      {},
                      all.map((r) =>
                        h(
                          'tr',
                          { dataset: { rollout: r.id, phase: r.phase } },
                          h('th', { scope: 'row' }, h('a', { href: `#/rollouts/${r.id}` }, `${r.package}@${r.version}`)),
                          h('td', {}, badge('phase', r.phase)),
                          h('td', { class: 'w-progress' }, progressBar(r.patched, r.failed, r.planned_nodes, `${r.patched} of ${r.planned_nodes} nodes patched`)),
                          h('td', { class: 'num' }, `${num(r.patched)}/${num(r.planned_nodes)}`, r.failed ? h('span', { class: 'bad' }, ` · ${num(r.failed)} failed`) : null),
                          h('td', { class: 'num' }, `${num(r.sites_done)}/${num(r.sites)}`),
                          h('td', { class: 'num' }, `${r.wave}/${r.waves}`),
                          h('td', { class: 'small' }, r.trigger),
                          authors ? h('td', { class: 'small' }, r.actor ? actorName(r.actor) : h('span', { class: 'muted' }, '—')) : null,
                          h('td', {}, ago(r.started)),
                          h('td', { class: r.phase === 'halted' ? 'bad small' : 'small' }, r.reason || ''),
                        ),
                      ),
                    ),
                  ),
                ),
              )
            : h('p', { class: 'muted pad' }, 'No rollouts yet. Registering a newer binary package starts one (auto-rollout), or POST /v1/commands/patch_package.'),
        );
      } catch (e) {
        if (e.status !== 401) el.append(errorBox(e));
      }
    }
    refreshRollouts();
    return { el, nav: 'rollouts', title: 'Rollouts', refreshRollouts };
  }

  function rolloutView(id) {
    const el = h('div', { id: 'rollout-page', dataset: { rollout: id } }, h('p', { class: 'muted pad' }, 'Loading…'));
    let seq = 0;
    let loaded = false;

    function actions(r) {
      if (!isOperator()) return null;
      const act = (kind, text, what) =>
        h('button', { type: 'button', class: 'btn btn-small', dataset: { action: kind } , onclick: async (ev) => {
          ev.currentTarget.disabled = true;
          // ResumeRollout carries no reason; the API refuses fields a command does not have.
          const body = kind === 'resume_rollout' ? { rollout_id: r.id } : { rollout_id: r.id, reason: `${auth.who.name}, from the dashboard` };
          await command(kind, body, what);
          stale.rollouts = true;
          scheduleFlush();
        } }, text);
      const out = [];
      if (r.phase === 'running') out.push(act('pause_rollout', 'Pause', `Pause rollout ${shortId(r.id)}`));
      if (r.phase === 'paused' || r.phase === 'halted') out.push(act('resume_rollout', 'Resume', `Resume rollout ${shortId(r.id)}`));
      if (r.phase === 'running' || r.phase === 'paused' || r.phase === 'halted') out.push(act('cancel_rollout', 'Cancel', `Cancel rollout ${shortId(r.id)}`));
      // Undoing: a rollout not a rollback and not undone yet; one under way is cancelled first.
      if (!r.rollback_of && !r.rolled_back_by) {
        const underWay = r.phase === 'running' || r.phase === 'paused';
        out.push(
          h('button', { type: 'button', class: 'btn btn-small', dataset: { action: 'rollback_rollout' }, onclick: async (ev) => {
            ev.currentTarget.disabled = true;
            const body = { rollout_id: r.id, cancel: underWay, reason: `${auth.who.name}, from the dashboard` };
            await command('rollback_rollout', body, `Roll back rollout ${shortId(r.id)}`);
            stale.rollouts = true;
            scheduleFlush();
          } }, underWay ? 'Cancel and roll back' : 'Roll back'),
        );
      }
      return h('div', { class: 'actions' }, out);
    }

    function render(d) {
      const r = d.rollout;
      const st = r.strategy || {};
      el.dataset.phase = r.phase;
      const nodeCounts = Object.entries(r.nodes || {});
      fill(el, 
        h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/rollouts' }, 'Rollouts'), ' / ', h('span', {}, shortId(r.id))),
        h('div', { class: 'page-head' }, h('h1', {}, `${r.package}@${r.version}`), badge('phase', r.phase), h('div', { class: 'spacer' }), actions(r)),
        r.reason
          ? h(
              'div',
              { class: `notice ${r.phase === 'halted' ? 'notice-error' : 'notice-warn'}`, role: 'status', id: 'rollout-reason' },
              h('strong', {}, `${label(r.phase).replace(/^./, (c) => c.toUpperCase())}: `),
              r.reason,
            )
          : null,
        h(
          'div',
          { class: 'grid-2' },
          h(
            'section',
            { class: 'card' },
            h('div', { class: 'card-head' }, h('h2', {}, 'Progress')),
            h('div', { class: 'pad' }, progressBar(r.patched, r.failed, r.planned_nodes, 'nodes patched')),
            factList([
              ['Nodes', `${num(r.patched)} patched, ${num(r.failed)} failed of ${num(r.planned_nodes)}`],
              ['Sites', `${num(r.sites_done)} of ${num(r.sites)} done${r.timed_out_sites ? `, ${r.timed_out_sites} timed out` : ''}`],
              ['Wave', `${r.wave} of ${r.waves}`],
              ['Node status', nodeCounts.length ? h('span', {}, nodeCounts.map(([k, v]) => h('span', { class: 'pill' }, `${label(k)} ${num(v)}`))) : '—'],
              ['Trigger', r.trigger || '—'],
              r.actor ? ['Started by', h('span', { id: 'rollout-actor' }, actorName(r.actor))] : null,
              r.rollback_of ? ['Undoes', h('a', { href: `#/rollouts/${r.rollback_of}`, id: 'rollout-undoes' }, shortId(r.rollback_of))] : null,
              r.rolled_back_by ? ['Undone by', h('a', { href: `#/rollouts/${r.rolled_back_by}`, id: 'rollout-undone-by' }, shortId(r.rolled_back_by))] : null,
              r.rolled_back ? ['Rolled back', `${plural(r.rolled_back, 'failed node')} put back, healthy again`] : null,
              r.unchanged ? ['Left as they were', `${plural(r.unchanged, 'node')} at the version already`] : null,
              ['Started', ago(r.started)],
              ['Finished', r.finished ? ago(r.finished) : '—'],
            ]),
          ),
          h(
            'section',
            { class: 'card' },
            h('div', { class: 'card-head' }, h('h2', {}, 'Strategy')),
            factList([
              ['Canary sites', String(st.canary_sites ?? '—')],
              ['Sites at once', String(st.max_concurrent_sites ?? '—')],
              ['Unavailable per site', String(st.max_unavailable || '—')],
              ['Failures tolerated', st.failure_threshold === undefined ? '—' : plural(st.failure_threshold, 'node')],
              ['Wave timeout', st.wave_timeout_seconds ? `${st.wave_timeout_seconds}s, then ${label(String(st.on_wave_timeout || '').replace(/^WAVE_TIMEOUT_ACTION_/, '').toLowerCase())}` : '—'],
            ]),
          ),
        ),
        h(
          'section',
          { class: 'card' },
          h('div', { class: 'card-head' }, h('h2', {}, `Sites (${num(d.sites.length)})`)),
          h(
            'div',
            { class: 'table-wrap' },
            h(
              'table',
              { class: 'table', id: 'rollout-sites' },
              h('thead', {}, h('tr', {}, ['#', 'Site', 'Wave', 'State', 'Nodes'].map((t) => h('th', { scope: 'col' }, t)))),
              h(
                'tbody',
                {},
                d.sites.slice(0, 500).map((s) =>
                  h(
                    'tr',
                    { dataset: { site: s.site, state: s.state } },
                    h('td', { class: 'num muted' }, String(s.index + 1)),
                    h('th', { scope: 'row' }, h('a', { href: `#/sites/${encodeURIComponent(s.site)}` }, s.site), s.canary ? h('span', { class: 'pill' }, 'canary') : null),
                    h('td', { class: 'num' }, String(s.wave)),
                    h('td', {}, badge('rsite', s.state)),
                    h(
                      'td',
                      {},
                      h(
                        'div',
                        { class: 'chips' },
                        (s.nodes || []).map((n) =>
                          h(
                            'span',
                            { class: `chip node-${n.status}`, title: n.reason ? `${n.node}: ${n.reason}${n.rollback ? `; ${n.rollback}` : ''}` : `${n.node}: ${n.from_version} → ${n.to_version} (${n.status})` },
                            h('span', { class: 'chip-name' }, n.node),
                            ' ',
                            label(n.status),
                            n.undone ? h('span', { class: 'pill', dataset: { undone: n.undone } }, n.undone) : null,
                          ),
                        ),
                      ),
                    ),
                  ),
                ),
              ),
            ),
          ),
          d.sites.length > 500 ? h('p', { class: 'muted pad small' }, `The first 500 of ${num(d.sites.length)} sites.`) : null,
        ),
      );
    }

    async function refreshRollouts() {
      const mine = ++seq;
      try {
        const d = await api(`/v1/rollouts/${encodeURIComponent(id)}`);
        if (mine !== seq) return;
        loaded = true;
        render(d);
      } catch (e) {
        if (mine === seq && !loaded && e.status !== 401) fill(el, h('nav', { class: 'crumbs' }, h('a', { href: '#/rollouts' }, 'Rollouts')), errorBox(e));
      }
    }
    refreshRollouts();
    return { el, nav: 'rollouts', title: `Rollout ${shortId(id)}`, refreshRollouts };
  }

  // ------------------------------------------------ packages

  function packagesView() {
    const el = h('div', {}, h('div', { class: 'page-head' }, h('h1', {}, 'Packages')), h('p', { class: 'muted pad' }, 'Loading…'));
    async function refreshPackages() {
      try {
        const all = await api('/v1/packages');
        fill(el, 
          h('div', { class: 'page-head' }, h('h1', {}, 'Packages'), h('span', { class: 'muted' }, `${num(all.length)} in the catalog`)),
          h(
            'section',
            { class: 'card' },
            h(
              'div',
              { class: 'table-wrap' },
              h(
                'table',
                { class: 'table', id: 'packages-table' },
                h('caption', { class: 'sr-only' }, 'The package catalog'),
                h('thead', {}, h('tr', {}, ['Name', 'Version', 'Kind', 'Size', 'SHA-256', 'Stored', 'Auto-rollout'].map((t) => h('th', { scope: 'col' }, t)))),
                h(
                  'tbody',
                  {},
                  all.map((p) =>
                    h(
                      'tr',
                      { dataset: { pkg: p.name, version: p.version } },
                      h('th', { scope: 'row' }, p.name),
                      h('td', { class: 'mono' }, p.version),
                      h('td', {}, h('span', { class: 'pill' }, p.kind)),
                      h('td', { class: 'num' }, bytes(p.size)),
                      h('td', { class: 'mono small', title: p.sha256 }, `${p.sha256.slice(0, 16)}…`),
                      h('td', {}, p.in_store ? 'yes' : h('span', { class: 'muted' }, 'metadata only')),
                      h('td', {}, p.auto_rollout ? h('span', { class: 'pill pill-ok' }, 'on') : h('span', { class: 'muted' }, 'off')),
                    ),
                  ),
                ),
              ),
            ),
          ),
        );
      } catch (e) {
        if (e.status !== 401) el.append(errorBox(e));
      }
    }
    refreshPackages();
    return { el, nav: 'packages', title: 'Packages', refreshPackages };
  }

  /** Gateways asking to join, and the sites' identities: approve, deny, revoke (operators). */
  function joiningView() {
    const el = h('div', {}, h('div', { class: 'page-head' }, h('h1', {}, 'Sites joining')), h('p', { class: 'muted pad' }, 'Loading…'));
    const when = (ms) => (ms && Number(ms) > 0 ? new Date(Number(ms)).toISOString().replace('.000Z', 'Z') : '—');
    async function act(path, body, what) {
      try {
        await api(path, { method: 'POST', body });
        toast(`${what}: done`, 'ok');
      } catch (e) {
        if (e.status !== 401) toast(`${what}: ${e.message}`, 'error');
      }
      refreshJoining();
    }
    const facts = (f) => Object.entries(f || {}).sort().map(([k, v]) => `${k}=${v}`).join(' ');
    async function refreshJoining() {
      let asked;
      let sites;
      try {
        [asked, sites] = await Promise.all([api('/v1/enrollments?all=true'), api('/v1/identities')]);
      } catch (e) {
        if (e.status !== 401) fill(el, h('div', { class: 'page-head' }, h('h1', {}, 'Sites joining')), errorBox(e));
        return;
      }
      const pending = asked.enrollments.filter((e) => !e.state || e.state === 'ENROLLMENT_STATE_PENDING');
      const decided = asked.enrollments.filter((e) => e.state && e.state !== 'ENROLLMENT_STATE_PENDING');
      const row = (e, open) =>
        h(
          'tr',
          { dataset: { key: e.identity_key, state: open ? 'pending' : 'decided' } },
          h('th', { scope: 'row', class: 'mono' }, e.fingerprint),
          h('td', {}, e.site_id || '?'),
          h('td', { class: 'small mono' }, facts(e.facts)),
          h('td', {}, when(e.requested_unix_ms)),
          h(
            'td',
            {},
            open && isOperator()
              ? [
                  h('button', { type: 'button', class: 'btn btn-small', dataset: { action: 'approve' }, onclick: () => act(`/v1/enrollments/${encodeURIComponent(e.identity_key)}/approve`, {}, `Approve ${e.fingerprint} as ${e.site_id}`) }, 'Approve'),
                  ' ',
                  h('button', { type: 'button', class: 'btn btn-small btn-ghost', dataset: { action: 'deny' }, onclick: () => act(`/v1/enrollments/${encodeURIComponent(e.identity_key)}/deny`, { reason: 'denied from the dashboard' }, `Deny ${e.fingerprint}`) }, 'Deny'),
                ]
              : h('span', { class: 'muted' }, open ? 'waiting' : `${String(e.state).replace('ENROLLMENT_STATE_', '').toLowerCase()} by ${e.decided_by || '?'} ${e.reason || ''}`),
          ),
        );
      const table = (id, caption, heads, rows) =>
        h('section', { class: 'card' }, h('div', { class: 'table-wrap' }, h('table', { class: 'table', id }, h('caption', {}, caption), h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col' }, t)))), h('tbody', {}, rows))));
      fill(
        el,
        h('div', { class: 'page-head' }, h('h1', {}, 'Sites joining'), h('span', { class: 'muted' }, `${num(pending.length)} waiting`)),
        table('enrollments-table', 'Requests to join', ['Fingerprint', 'Site', 'Machine', 'Asked', ''], pending.map((e) => row(e, true)).concat(decided.map((e) => row(e, false)))),
        table(
          'identities-table',
          'Site identities',
          ['Site', 'Key', 'Enrolled', 'Link expires', ''],
          sites.sites.map((s) =>
            h(
              'tr',
              { dataset: { site: s.site_id, revoked: s.revoked ? 'yes' : 'no' } },
              h('th', { scope: 'row' }, h('a', { href: `#/sites/${encodeURIComponent(s.site_id)}` }, s.site_id)),
              h('td', { class: 'mono small', title: s.identity_key }, `${s.identity_key.slice(0, 12)}…`),
              h('td', {}, when(s.enrolled_unix_ms)),
              h('td', {}, s.links && s.links.length ? when(s.links[s.links.length - 1].expires_unix_ms) : '—'),
              h(
                'td',
                {},
                s.revoked
                  ? h('span', { class: 'pill pill-bad' }, `revoked ${s.revoked_reason || ''}`)
                  : isOperator()
                    ? h('button', { type: 'button', class: 'btn btn-small', dataset: { action: 'revoke' }, onclick: () => {
                        if (window.confirm(`Revoke site ${s.site_id}? Its gateway and leaf node are disconnected and cannot connect again.`)) act(`/v1/sites/${encodeURIComponent(s.site_id)}/revoke`, { reason: 'revoked from the dashboard' }, `Revoke ${s.site_id}`);
                      } }, 'Revoke')
                    : h('span', { class: 'pill pill-ok' }, 'active'),
              ),
            ),
          ),
        ),
      );
    }
    refreshJoining();
    const timer = setInterval(refreshJoining, 5000);
    return { el, nav: 'joining', title: 'Sites joining', refreshJoining, unmount: () => clearInterval(timer) };
  }

  // ---------------------------------------------------------------- routing and start-up

  function route() {
    // A link with another token in it signs this tab in again.
    if (takeTokenFromUrl()) {
      start();
      return;
    }
    if (!auth.token || !auth.who) return;
    const path = location.hash.replace(/^#/, '') || '/';
    let m;
    if ((m = path.match(/^\/sites\/([^/?]+)/))) mount(siteView(decodeURIComponent(m[1])));
    else if ((m = path.match(/^\/rollouts\/([^/?]+)/))) mount(rolloutView(decodeURIComponent(m[1])));
    else if (path.startsWith('/rollouts')) mount(rolloutsView());
    else if (path.startsWith('/packages')) mount(packagesView());
    else if (path.startsWith('/joining')) mount(joiningView());
    else mount(fleetView());
    $('#view').focus({ preventScroll: true });
    window.scrollTo(0, 0);
  }

  let mainStream = null;

  /**
   * The sign-in screen: the identity provider's button when the API names one (signin.js), and
   * the API token form. `endSession`: after a sign-out, where to end the provider's session too.
   */
  function showLogin(message, endSession) {
    if (view && view.unmount) view.unmount();
    view = null;
    document.body.classList.add('signed-out');
    const form = $('#login-template').content.cloneNode(true);
    fill($('#view'), form);
    const err = $('#login-error');
    const say = (text) => {
      err.textContent = text;
      err.hidden = !text;
    };
    if (message) say(message);
    sso.mount($('#view'), { endSession, fail: say });
    $('#login-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const token = $('#token-input').value.trim();
      if (!token) return;
      useApiToken(token);
      err.hidden = true;
      await start();
    });
    if (sso.config) $('#sso-signin').focus();
    else $('#token-input').focus();
  }

  /**
   * Forgets the token. A person signed in through the identity provider is offered to end its
   * session too: when they chose to sign out, or were let in but may do nothing (so that they
   * can sign in as someone else), not when their session ran out.
   */
  function signOut(message, offerEndSession = !message) {
    const endSession = auth.sso || sso.session() ? sso.forget() : null;
    auth.token = '';
    auth.who = null;
    auth.sso = false;
    sessionStorage.removeItem(TOKEN_KEY);
    if (mainStream) mainStream.stop();
    mainStream = null;
    setConn('offline');
    $('#whoami').hidden = true;
    $('#signout').hidden = true;
    showLogin(message, offerEndSession ? endSession : null);
  }

  function unreachable(e) {
    setConn('reconnecting');
    fill($('#view'), errorBox(new Error(`The API does not answer (${e.message}); retrying…`)));
    setTimeout(start, 3000);
  }

  /**
   * Which token this tab uses: the identity provider's, coming back from its sign-in page or
   * kept from before, else an API token (from a `#token=` link, the form, or kept).
   */
  async function signIn() {
    const linked = takeTokenFromUrl();
    await sso.discover();
    if (sso.returning()) {
      const s = await sso.finish();
      sessionStorage.removeItem(TOKEN_KEY);
      auth.token = s.access_token;
      auth.sso = true;
      return;
    }
    const s = linked ? null : sso.session();
    auth.sso = Boolean(s);
    if (s) auth.token = s.access_token;
  }

  async function start() {
    try {
      await signIn();
    } catch (e) {
      if (e instanceof sso.SignInError) {
        setConn('offline');
        showLogin(e.message);
      } else {
        unreachable(e);
      }
      return;
    }
    if (!auth.token) {
      setConn('offline');
      showLogin();
      return;
    }
    if (auth.sso) {
      sso.watch({
        renewed: (s) => {
          auth.token = s.access_token;
        },
        ended: (e) => signOut(`Your session at ${sso.host()} has ended (${e.message}): sign in again.`),
      });
    }
    try {
      auth.who = await api('/v1/whoami');
    } catch (e) {
      if (e.status === 403) {
        signOut(e.message, true);
      } else if (e.status !== 401) {
        unreachable(e);
      }
      return;
    }
    document.body.classList.remove('signed-out');
    const who = $('#whoami');
    const scope = scopeText(auth.who);
    fill(
      who,
      h('span', { class: 'who-name' }, auth.who.name),
      h('span', { class: `pill role-${auth.who.role || 'none'}` }, auth.who.role || 'no role'),
      scope ? h('span', { class: 'who-scope', id: 'who-scope', title: scope }, `· ${scope}`) : null,
    );
    who.dataset.role = auth.who.role || 'none';
    who.hidden = false;
    $('#signout').hidden = false;
    fill($('#feed'), h('li', { class: 'feed-empty muted' }, 'Waiting for events…'));
    feed.total = 0;
    route();
    if (mainStream) mainStream.stop();
    // The feed's worth of history, not a time's: after a fleet's install the last quarter hour
    // holds hundreds of thousands of events, and replaying them would keep the page busy.
    mainStream = new EventStream({}, { last: FEED_MAX }, onEvent, (state, again) => {
      setConn(state);
      // After a reconnect, read what is on screen again (nothing is missed, but be sure).
      if (state === 'live' && again) markAll();
    }).start();
  }

  $('#signout').addEventListener('click', () => signOut());
  window.addEventListener('hashchange', route);
  // Relative times move on by themselves.
  setInterval(() => {
    for (const t of document.querySelectorAll('[data-rel]')) t.textContent = relTime(t.dataset.rel);
  }, 5000);
  // A slow safety net: whatever is on screen is read again now and then.
  setInterval(() => {
    if (view && document.visibilityState === 'visible') markAll();
  }, SAFETY_REFRESH_MS);
  start();
})();
