"""The web page: jobs, a job's story across its attempts, experiments' cost, pools and
teams, served by `spotrain up` on the local stack (`spotrain ui` opens it)."""
