-- Chat threads (issue 19): appeal decisions are posted as replies in the thread of the warning they answer.
-- `thread_ts`: the thread a post is in: a post's own id as the chat gave it (the `ts` a Slack-compatible
-- endpoint answers with), a reply's parent's; '' when the chat gave none (apprise, an incoming webhook).
-- `reply_to`: on a decision's row (keyed by the appeal step's event_id), the alert whose post it answers, at
-- that post's destination (in its thread when thread_ts is set); '' for a new post.
ALTER TABLE chat_deliveries ADD COLUMN IF NOT EXISTS thread_ts String DEFAULT '';
ALTER TABLE chat_deliveries ADD COLUMN IF NOT EXISTS reply_to String DEFAULT '';
