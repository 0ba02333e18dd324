// Sign-in. Locally (config auth "dev") the user pastes the dev bearer token; deployed (auth "oidc")
// the console is a public OIDC client: authorization code with PKCE (S256, WebCrypto) against the
// issuer the API's JWT authorizer trusts. Tokens live in sessionStorage only (this tab, never a URL,
// never persistent local storage); the authorization code and state are removed from the address bar at once.

const KEY = "kairos.token";
const PENDING = "kairos.pkce";
let config = null;
let onSignOut = () => {};

export async function loadConfig() {
  const response = await fetch("config.json", { cache: "no-store" });
  config = await response.json();
  return config;
}

export function token() {
  const saved = JSON.parse(sessionStorage.getItem(KEY) || "null");
  if (!saved) return null;
  if (saved.expires_at && Date.now() > saved.expires_at) {
    sessionStorage.removeItem(KEY);
    return null;
  }
  return saved.token;
}

export function signedIn() { return Boolean(token()); }

// Whether the API has ever taken the current token: a 401 then means the session ended; before
// that, the token itself was not accepted (a mistyped dev token says so, not "session ended").
export function accepted() {
  const saved = JSON.parse(sessionStorage.getItem(KEY) || "null");
  return Boolean(saved && saved.accepted);
}

export function markAccepted() {
  const saved = JSON.parse(sessionStorage.getItem(KEY) || "null");
  if (!saved || saved.accepted) return;
  sessionStorage.setItem(KEY, JSON.stringify({ ...saved, accepted: true }));
}

export function whenSignedOut(callback) { onSignOut = callback; }

export function signOut(message) {
  sessionStorage.removeItem(KEY);
  onSignOut(message);
}

export function useDevToken(value) {
  sessionStorage.setItem(KEY, JSON.stringify({ token: value.trim() }));
}

function b64url(bytes) {
  let text = "";
  for (const b of new Uint8Array(bytes)) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function random(n) { return b64url(crypto.getRandomValues(new Uint8Array(n))); }

async function discovery() {
  if (config.authorization_endpoint && config.token_endpoint) return config;
  const response = await fetch(`${config.issuer}/.well-known/openid-configuration`);
  if (!response.ok) throw new Error("the sign-in provider did not answer its discovery document");
  return response.json();
}

function redirectUri() { return `${location.origin}${location.pathname}`; }

export async function startOidc() {
  const meta = await discovery();
  const verifier = random(32);
  const state = random(16);
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  // The page the user was on comes back after the sign-in (the provider returns to the bare redirect URI).
  sessionStorage.setItem(PENDING, JSON.stringify({ verifier, state, hash: location.hash }));
  const q = new URLSearchParams({
    response_type: "code", client_id: config.client_id, redirect_uri: redirectUri(), scope: config.scopes,
    state, code_challenge: challenge, code_challenge_method: "S256",
  });
  location.assign(`${meta.authorization_endpoint}?${q}`);
}

// Completes a sign-in when the provider sent the browser back with ?code=&state=; true when it did.
export async function finishOidc() {
  const params = new URLSearchParams(location.search);
  const code = params.get("code");
  if (!code) return false;
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  // The code leaves the address bar at once; the page the sign-in started from comes back.
  history.replaceState(null, "", redirectUri() + ((pending && pending.hash) || location.hash));
  sessionStorage.removeItem(PENDING);
  if (!pending || pending.state !== params.get("state")) throw new Error("sign-in state mismatch; try again");
  const meta = await discovery();
  const response = await fetch(meta.token_endpoint, {
    method: "POST",
    headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code", code, redirect_uri: redirectUri(), client_id: config.client_id,
      code_verifier: pending.verifier,
    }),
  });
  const answer = await response.json();
  if (!response.ok || !answer.access_token) throw new Error("the sign-in provider refused the code");
  const expires = Date.now() + (Number(answer.expires_in) || 3600) * 1000;
  sessionStorage.setItem(KEY, JSON.stringify({ token: answer.access_token, expires_at: expires }));
  return true;
}
