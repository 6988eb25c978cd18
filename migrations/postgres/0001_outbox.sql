-- outboxd schema, version 1.
--
-- Placeholders {outbox}, {partitions} and {workers} are replaced by the
-- configured table names before this runs (see src/store/schema.rs); apply it
-- with `outboxd migrate`, not with a generic migration tool. Never edit a
-- migration after it has landed: add a new one.

-- One row per message. Producers insert through {outbox}_enqueue() (or plain
-- INSERT with a partition_key computed by {outbox}_partition_for()) inside
-- the transaction that changes their business data.
CREATE TABLE {outbox} (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition_key text        NOT NULL,
    message_key   text        NOT NULL,
    exchange      text        NOT NULL DEFAULT '',
    routing_key   text        NOT NULL,
    message_id    uuid        NOT NULL DEFAULT gen_random_uuid(),
    headers       jsonb       NOT NULL DEFAULT '{}',
    content_type  text,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    available_at  timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    failed_at     timestamptz,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    claim_token   uuid,
    claimed_until timestamptz,
    CONSTRAINT {outbox}_message_id_key UNIQUE (message_id),
    CONSTRAINT {outbox}_headers_object CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT {outbox}_partition_key_format CHECK (partition_key ~ '^p[0-9]{2,4}$')
);

-- "The next rows of bucket b in id order that are not yet published" is a
-- range scan of this index whatever the table size: published and parked
-- rows are not in it.
CREATE INDEX {outbox}_pending_idx ON {outbox} (partition_key, id)
    WHERE published_at IS NULL AND failed_at IS NULL;

-- Parked rows, for the Failed views and requeue.
CREATE INDEX {outbox}_failed_idx ON {outbox} (partition_key, id)
    WHERE failed_at IS NOT NULL;

-- One row per bucket: who may publish it (fleet mode).
CREATE TABLE {partitions} (
    partition_key text        PRIMARY KEY,
    lease_owner   uuid,
    lease_until   timestamptz,
    lease_epoch   bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- One row per live worker.
CREATE TABLE {workers} (
    worker_id       uuid        PRIMARY KEY,
    hostname        text        NOT NULL,
    pid             integer     NOT NULL,
    version         text        NOT NULL,
    mode            text        NOT NULL CHECK (mode IN ('leasing', 'no-leasing')),
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_until timestamptz NOT NULL
);

-- Deployment-wide settings (a single row), written by `outboxd migrate`.
CREATE TABLE {outbox}_settings (
    singleton       boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    partition_count integer     NOT NULL CHECK (partition_count BETWEEN 1 AND 1024),
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- IEEE CRC-32 (zlib.crc32, PHP crc32(), java.util.zip.CRC32) of bytes.
CREATE FUNCTION {outbox}_crc32(data bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    tbl CONSTANT bigint[] := '{
    0,1996959894,3993919788,2567524794,124634137,1886057615,3915621685,2657392035,
    249268274,2044508324,3772115230,2547177864,162941995,2125561021,3887607047,2428444049,
    498536548,1789927666,4089016648,2227061214,450548861,1843258603,4107580753,2211677639,
    325883990,1684777152,4251122042,2321926636,335633487,1661365465,4195302755,2366115317,
    997073096,1281953886,3579855332,2724688242,1006888145,1258607687,3524101629,2768942443,
    901097722,1119000684,3686517206,2898065728,853044451,1172266101,3705015759,2882616665,
    651767980,1373503546,3369554304,3218104598,565507253,1454621731,3485111705,3099436303,
    671266974,1594198024,3322730930,2970347812,795835527,1483230225,3244367275,3060149565,
    1994146192,31158534,2563907772,4023717930,1907459465,112637215,2680153253,3904427059,
    2013776290,251722036,2517215374,3775830040,2137656763,141376813,2439277719,3865271297,
    1802195444,476864866,2238001368,4066508878,1812370925,453092731,2181625025,4111451223,
    1706088902,314042704,2344532202,4240017532,1658658271,366619977,2362670323,4224994405,
    1303535960,984961486,2747007092,3569037538,1256170817,1037604311,2765210733,3554079995,
    1131014506,879679996,2909243462,3663771856,1141124467,855842277,2852801631,3708648649,
    1342533948,654459306,3188396048,3373015174,1466479909,544179635,3110523913,3462522015,
    1591671054,702138776,2966460450,3352799412,1504918807,783551873,3082640443,3233442989,
    3988292384,2596254646,62317068,1957810842,3939845945,2647816111,81470997,1943803523,
    3814918930,2489596804,225274430,2053790376,3826175755,2466906013,167816743,2097651377,
    4027552580,2265490386,503444072,1762050814,4150417245,2154129355,426522225,1852507879,
    4275313526,2312317920,282753626,1742555852,4189708143,2394877945,397917763,1622183637,
    3604390888,2714866558,953729732,1340076626,3518719985,2797360999,1068828381,1219638859,
    3624741850,2936675148,906185462,1090812512,3747672003,2825379669,829329135,1181335161,
    3412177804,3160834842,628085408,1382605366,3423369109,3138078467,570562233,1426400815,
    3317316542,2998733608,733239954,1555261956,3268935591,3050360625,752459403,1541320221,
    2607071920,3965973030,1969922972,40735498,2617837225,3943577151,1913087877,83908371,
    2512341634,3803740692,2075208622,213261112,2463272603,3855990285,2094854071,198958881,
    2262029012,4057260610,1759359992,534414190,2176718541,4139329115,1873836001,414664567,
    2282248934,4279200368,1711684554,285281116,2405801727,4167216745,1634467795,376229701,
    2685067896,3608007406,1308918612,956543938,2808555105,3495958263,1231636301,1047427035,
    2932959818,3654703836,1088359270,936918000,2847714899,3736837829,1202900863,817233897,
    3183342108,3401237130,1404277552,615818150,3134207493,3453421203,1423857449,601450431,
    3009837614,3294710456,1567103746,711928724,3020668471,3272380065,1510334235,755167117
    }';
    crc bigint := 4294967295;
BEGIN
    FOR i IN 0 .. length(data) - 1 LOOP
        crc := (crc >> 8) # tbl[((crc # get_byte(data, i)) & 255) + 1];
    END LOOP;
    RETURN crc # 4294967295;
END
$fn$;

-- The bucket label of a message key; the same function as the Rust
-- partitioner (src/partitioner.rs): 'p' || crc32 % partition_count, padded
-- to the digits of partition_count, at least two.
CREATE FUNCTION {outbox}_partition_for(message_key text) RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $fn$
    SELECT 'p' || lpad(({outbox}_crc32(convert_to(message_key, 'UTF8')) % s.partition_count)::text,
                       greatest(2, length(s.partition_count::text)), '0')
    FROM {outbox}_settings s
$fn$;

-- Enqueue a message inside the caller's transaction; returns its id. The
-- NOTIFY is delivered at commit and wakes the idle worker of that bucket.
CREATE FUNCTION {outbox}_enqueue(
    message_key  text,
    exchange     text,
    routing_key  text,
    payload      bytea,
    headers      jsonb DEFAULT '{}',
    content_type text  DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_partition text;
    v_id        bigint;
BEGIN
    IF {outbox}_enqueue.message_key IS NULL THEN
        RAISE EXCEPTION '{outbox}_enqueue: message_key must not be NULL';
    END IF;
    v_partition := {outbox}_partition_for({outbox}_enqueue.message_key);
    IF v_partition IS NULL THEN
        RAISE EXCEPTION '{outbox}_enqueue: {outbox}_settings is empty; run outboxd migrate';
    END IF;
    INSERT INTO {outbox} (partition_key, message_key, exchange, routing_key, payload, headers, content_type)
    VALUES (v_partition,
            {outbox}_enqueue.message_key,
            coalesce({outbox}_enqueue.exchange, ''),
            {outbox}_enqueue.routing_key,
            {outbox}_enqueue.payload,
            coalesce({outbox}_enqueue.headers, '{}'),
            {outbox}_enqueue.content_type)
    RETURNING {outbox}.id INTO v_id;
    PERFORM pg_notify('{outbox}_enqueued', v_partition);
    RETURN v_id;
END
$fn$;
