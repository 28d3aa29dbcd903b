"""Running a user's training command as it is written: the launcher the platform puts in
front of every job's command (`python -m shared.usercode.launch -- ARGV`), the defaults it
gives Ray Train, and the checkpoint folder it keeps for plain scripts."""
