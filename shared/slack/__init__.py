"""The Slack bot: `/train` submits, shows and cancels jobs, and each job's state changes
are posted in the Slack thread it was submitted from. Run it: `python -m shared.slack`.

Setting it up: create a Slack app with a slash command `/train` whose Request URL is
`https://<host>/slack/events`, and a bot token with the `commands` and `chat:write`
scopes; invite the bot to the channels it should post in. Then set
`SPOTRAIN_SLACK_SIGNING_SECRET`, `SPOTRAIN_SLACK_BOT_TOKEN`, `SPOTRAIN_SLACK_OWNERS`
(JSON: Slack user id → spotrain owner; anyone else is refused) and
`SPOTRAIN_SLACK_PROJECTS` (JSON: name → `{"entrypoint": [...]}`), plus
`SPOTRAIN_SLACK_HOST`/`PORT` and the usual `SPOTRAIN_NATS_URL` (see `settings.py`).

What `/train submit` runs: Slack has no working directory to upload, so a user submits a
*registered project*, an entrypoint already in the training image (no `working_dir`), with
their own arguments after `--`. Arbitrary commands cannot be run from a chat message.

Where updates go: the bot announces each submission in the channel and uses that message
as the job's thread; channel, thread and Slack user travel in the job's labels
(`slack-channel`, `slack-thread`, `slack-user`), so the bot keeps no state of its own. A
durable consumer on the job events posts each state change there, in order, and picks up
where it left off after a restart (at least once: a post may rarely show twice).
"""
