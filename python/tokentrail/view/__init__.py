"""The trajectory viewer: a session's tree and every token's fate, in the browser.

`tokentrail view PATH` serves a journal's sessions on 127.0.0.1; a running adapter serves its
live sessions at `/tokentrail/ui` behind the admin token. See `view.app` and `view.view_model`.
"""
