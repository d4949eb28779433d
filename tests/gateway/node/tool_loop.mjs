// An unmodified tool loop with the openai npm package: no tokenwire header. Prints one JSON
// line per request: the identity headers the gateway answered with.
// Usage: node tool_loop.mjs GATEWAY_URL API_KEY
import OpenAI from "openai";

const [url, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0, timeout: 20000 });
const tools = [{ type: "function", function: { name: "lookup", parameters: { type: "object", properties: {} } } }];
const messages = [{ role: "user", content: "look it up from node" }];

async function ask() {
  const { data, response } = await client.chat.completions
    .create({ model: "scripted/tools", messages, tools })
    .withResponse();
  const h = (name) => response.headers.get(name);
  console.log(JSON.stringify({
    session: h("x-tokenwire-session"), turn: h("x-tokenwire-turn"), step: h("x-tokenwire-step"),
    match: h("x-tokenwire-session-match"), parent: h("x-tokenwire-parent"),
  }));
  return data.choices[0].message;
}

const asked = await ask();
messages.push(asked);
for (const call of asked.tool_calls) messages.push({ role: "tool", tool_call_id: call.id, content: "42" });
const answer = await ask();
if (answer.tool_calls?.length || !answer.content) throw new Error("the loop did not end with an answer");
