// A long session of the Vercel AI SDK's `openai()` provider (the Responses API) through
// compaction-proxy, alternating generateText and streamText. The upstream (the test's
// mock) has a small window that the history outgrows within a few turns; the SDK must
// never see an error.
import { generateText, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const TURNS = 12;
const openai = createOpenAI({
  baseURL: process.env.OPENAI_BASE_URL,
  apiKey: 'sk-test',
  headers: { 'x-mock': 'window', 'x-mock-shape': 'responses-stream', 'x-mock-window': '6000' },
});
const model = openai('mock-agent-model');
const messages = [];
for (let turn = 1; turn <= TURNS; turn++) {
  const log = `line ${turn}: compiling module_${turn} ... warning: unused variable\n`.repeat(40);
  messages.push({ role: 'user', content: `Turn ${turn}: what failed?\n${log}` });
  let result;
  try {
    if (turn % 2) {
      result = await generateText({ model, messages, maxRetries: 0 });
    } else {
      let failure = null;
      const stream = streamText({ model, messages, maxRetries: 0, onError: ({ error }) => { failure = error; } });
      for await (const _ of stream.textStream) { /* read it all */ }
      if (failure) throw failure;
      result = { text: await stream.text, response: await stream.response };
    }
  } catch (error) {
    console.error(`FAIL: turn ${turn}: ${error}`);
    process.exit(1);
  }
  if (!result.text.includes('MOCK-RESPONSE')) {
    console.error(`FAIL: turn ${turn}: unexpected reply ${JSON.stringify(result.text)}`);
    process.exit(1);
  }
  messages.push(...result.response.messages);
}
console.log(`${TURNS} turns, no error seen by the SDK`);
