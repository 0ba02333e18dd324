-- Effect targets keep no secret a base_url carried (issue 10): before this, an effect recorded the
-- whole URL it called, so a key passed as `?api-key=…` (or `user:pass@`) sat in the ledger.
-- The same two rules as kairos.executors.base.recorded_target, which every new row now passes:
-- cut at the first `?` or `#` (query and fragment), then drop `userinfo@` from the authority.
-- Only the rows that can carry either are rewritten; effects have no update trigger.
UPDATE effects
   SET target = regexp_replace(
           regexp_replace(target, '[?#].*$', ''),
           '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@', '\1')
 WHERE target ~ '[?#@]';
