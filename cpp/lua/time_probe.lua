-- Whether this server lets scripts read TIME: replies with TIME's {seconds, microseconds},
-- or fails the way every clock='server' script would.
if redis.replicate_commands then redis.replicate_commands() end
return redis.call('TIME')
