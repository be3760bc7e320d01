// A scripted model speaking the Gemini API the way Gemini CLI calls it through @google/genai:
// POST /v1beta/models/MODEL:streamGenerateContent?alt=sse answered with SSE `data:` events of
// GenerateContentResponse ({ candidates: [{ content: { role: "model", parts } }] }), parts being
// { text } or { functionCall: { name, args } }; the tool results come back in the next request
// as user parts { functionResponse: { name, response } }. Also answered: …:countTokens, and the
// non-streamed …:generateContent side requests Gemini CLI makes on its own (its model router's
// classifier, the next-speaker check), each with a plausible JSON answer that keeps the main
// model; any other request is logged and answered 404.
//
// startModel(decide) → { url, requests, toolResults, close() }: the neutral interface of
// tests/hosts/lib.mjs. `url` is what GOOGLE_GEMINI_BASE_URL takes.
import { createHash, randomBytes } from 'node:crypto';
import { sse, startRecordingServer } from '../lib.mjs';

function sendJson(res, value, status = 200) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

const USAGE = { promptTokenCount: 10, candidatesTokenCount: 5, totalTokenCount: 15 };

/** The text of a functionResponse's `response` value (Gemini CLI wraps the MCP content). */
function responseText(response) {
  if (response == null) return '';
  if (typeof response === 'string') return response;
  if (typeof response.output === 'string') return response.output;
  if (typeof response.error === 'string') return response.error;
  if (Array.isArray(response.content)) return response.content.map((c) => c.text ?? '').join('');
  return JSON.stringify(response);
}

/** Gemini CLI puts its own context block first, as a text part of the prompt's content. */
function promptParts(content) {
  if (content.role !== 'user') return [];
  return (content.parts ?? []).filter((p) => typeof p.text === 'string' && !p.text.trimStart().startsWith('<session_context>'));
}

/**
 * The neutral view of one request: the last user content with text (the prompt; Gemini CLI's
 * own context block comes first as a separate content), the functionResponse parts after it,
 * and the function declarations offered.
 */
export function parseRequest(body) {
  const contents = body?.contents ?? [];
  let last = -1;
  for (let i = contents.length - 1; i >= 0 && last < 0; i--) if (promptParts(contents[i]).length) last = i;
  const prompt = last >= 0 ? promptParts(contents[last]).map((p) => p.text).join('') : '';
  const results = [];
  for (const c of contents.slice(last + 1)) {
    for (const p of c.parts ?? []) {
      if (!p.functionResponse) continue;
      const { name, response } = p.functionResponse;
      results.push({ name, text: responseText(response), isError: response?.error !== undefined });
    }
  }
  const tools = (body?.tools ?? []).flatMap((t) => (t.functionDeclarations ?? []).map((f) => f.name));
  return { prompt, results, tools };
}

function parts(answer) {
  if (answer.calls?.length) {
    return answer.calls.map((c) => ({ functionCall: { name: c.name, args: c.arguments ?? {} } }));
  }
  return [{ text: answer.text ?? '' }];
}

function chunk(model, partsOut) {
  return {
    candidates: [{ content: { role: 'model', parts: partsOut }, finishReason: 'STOP', index: 0 }],
    usageMetadata: USAGE,
    modelVersion: model,
    responseId: randomBytes(8).toString('hex'),
  };
}

/**
 * A side request's answer: JSON that satisfies the schema Gemini CLI asked for, keeping the
 * conversation where it is (the router's classifier gets the lowest complexity score, the
 * next-speaker check says the user speaks next).
 */
function sideAnswer(body) {
  const schema = body?.generationConfig?.responseJsonSchema ?? body?.generationConfig?.responseSchema;
  const props = schema?.properties ?? {};
  if (!schema) return 'ok';
  const out = {};
  for (const [k, v] of Object.entries(props)) {
    if (k === 'next_speaker') out[k] = 'user';
    else if (v?.enum?.length) out[k] = v.enum[0];
    else if (v?.type === 'boolean' || v?.type === 'BOOLEAN') out[k] = false;
    else if (/^(number|integer)$/i.test(v?.type ?? '')) out[k] = v.minimum ?? 1;
    else out[k] = 'scripted';
  }
  return JSON.stringify(out);
}

export async function startModel(decide) {
  const toolResults = [];
  // Each request repeats the conversation. Gemini CLI 0.61 gives every functionResponse the id
  // of its functionCall, and a resumed conversation (`--resume`) repeats the history re-shaped
  // (the responses of two calls merged into one content, thought signatures dropped): a result
  // is known by that id. One without an id is known by the conversation up to it (a hash of
  // that prefix).
  const seen = new Set();
  const newResults = (body) => {
    const fresh = [];
    const contents = body?.contents ?? [];
    contents.forEach((c, i) => {
      (c.parts ?? []).forEach((p, j) => {
        if (!p.functionResponse) return;
        const prefix = JSON.stringify([contents.slice(0, i), c.parts.slice(0, j + 1)]);
        const key = p.functionResponse.id
          ? `id:${p.functionResponse.id}`
          : createHash('sha256').update(prefix).digest('hex');
        if (seen.has(key)) return;
        seen.add(key);
        const { name, response } = p.functionResponse;
        fresh.push({ name, text: responseText(response), isError: response?.error !== undefined });
      });
    });
    return fresh;
  };
  const server = await startRecordingServer(async (_req, res, req) => {
    const pathname = new URL(req.path, 'http://x').pathname;
    const m = pathname.match(/\/models\/([^/:]+):(\w+)$/);
    const [, model, method] = m ?? [];
    if (req.method === 'POST' && method === 'streamGenerateContent') {
      const view = parseRequest(req.body);
      for (const r of newResults(req.body)) toolResults.push(r);
      const answer = await decide(view);
      const send = sse(res);
      send(null, chunk(model, parts(answer)));
      res.end();
      return;
    }
    if (req.method === 'POST' && method === 'generateContent') {
      sendJson(res, chunk(model, [{ text: sideAnswer(req.body) }]));
      return;
    }
    if (req.method === 'POST' && method === 'countTokens') {
      sendJson(res, { totalTokens: 10 });
      return;
    }
    sendJson(res, { error: { code: 404, message: `scripted model: no ${req.method} ${pathname}`, status: 'NOT_FOUND' } }, 404);
  });
  return { url: server.url, requests: server.requests, toolResults, close: server.close };
}
